// Shared definitions of the attention kernels (prepended to attn_fwd.cu / attn_bwd.cu by
// validate/src/gpu.rs before NVRTC compiles them; no #include, so no toolkit headers needed).

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#define BLOCK_M (16 * NWARPS)
#define BLOCK_N 64
#define NTHREADS (32 * NWARPS)
#define CHUNKS (HEAD_DIM / 8)  // 16-byte chunks per row
#define KSTEPS (HEAD_DIM / 16) // k-steps of the QK^T product
#define DTILES (HEAD_DIM / 8)  // n-tiles of the output row
#define NTILES (BLOCK_N / 8)   // n-tiles of the score row

typedef unsigned short bf16_t;
typedef unsigned int u32;
#define NEG_INF (__int_as_float(0xff800000))

struct Tile {
    int unit;
    int m_block;
};

struct Unit {
    int q_off;
    int kv_off;
    int a;
    int e;
};

// Swizzled shared-memory offset (in elements) of row r, 16-byte chunk c: chunk ^ (r & 7) spreads
// the 8 rows an ldmatrix phase reads over 8 distinct bank groups.
__device__ __forceinline__ int swz(int r, int c) { return r * HEAD_DIM + ((c ^ (r & 7)) << 3); }

__device__ __forceinline__ u32 smem_u32(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    int n = valid ? 16 : 0; // src-size 0: zero-fill, nothing read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Pack two floats into bf16x2, `lo` in the low half (round to nearest even).
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Issue the cp.async copies of `rows` rows of one head (row stride `stride` elements) starting at
// global row `row0` into swizzled shared tile `dst`; rows at or past `row_end` are zero-filled.
__device__ __forceinline__ void load_tile(bf16_t* dst, const bf16_t* base, long long row0,
                                          int valid_rows, long long stride, int rows) {
    const u32 sbase = smem_u32(dst);
    for (int i = threadIdx.x; i < rows * CHUNKS; i += NTHREADS) {
        const int r = i / CHUNKS;
        const int c = i % CHUNKS;
        const bool ok = r < valid_rows;
        const bf16_t* src = base + (ok ? (row0 + r) * stride : row0 * stride) + c * 8;
        cp_async16(sbase + 2u * swz(r, c), src, ok);
    }
}

