// Forward causal attention over a variable-length batch of work units.
//
// Compiled at run time by NVRTC (validate/src/gpu.rs) with -DHEAD_DIM=64|128 and -DNWARPS=4|8.
// Header-free: bf16 is carried as raw 16-bit words, tensor-core work is inline PTX
// (ldmatrix + mma.sync.m16n8k16 bf16 -> fp32, cp.async double buffering), so the kernel needs no
// CUDA toolkit headers on the machine that compiles it.
//
// Layout (same as PyTorch varlen / FlashAttention varlen):
//   Q, O : [total_q , h_q , HEAD_DIM] bf16       LSE : [total_q, h_q] fp32 (natural log)
//   K, V : [total_kv, h_kv, HEAD_DIM] bf16       head h reads kv head h / (h_q / h_kv) (GQA)
// A work unit u = (q_off, kv_off, a, e): query rows for sample positions a..e-1 live at
// Q[q_off + (p - a)], the sample's keys 0..e-1 at K[kv_off + j]; position p attends keys j <= p
// (causal, bottom-right aligned when a > 0).
// A tile t = (unit, m_block) is BLOCK_M = 16*NWARPS consecutive query positions of one unit; the
// host orders tiles heaviest first. Grid = (num_tiles, h_q), block = 32*NWARPS threads, each warp
// owns 16 query rows; the attention matrix is never materialised (online softmax, FA-2 style).

// attn_common.cuh (HEAD_DIM, NWARPS, tiles, swizzle, PTX wrappers) is prepended by the host.

extern "C" __global__ void __launch_bounds__(NTHREADS)
    attn_fwd(const bf16_t* __restrict__ Q, const bf16_t* __restrict__ K,
             const bf16_t* __restrict__ V, bf16_t* __restrict__ O, float* __restrict__ LSE,
             const Unit* __restrict__ units, const Tile* __restrict__ tiles, int h_q, int h_kv,
             float scale_log2) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
    bf16_t* sK = sQ + BLOCK_M * HEAD_DIM;         // [2][BLOCK_N][HEAD_DIM]
    bf16_t* sV = sK + 2 * BLOCK_N * HEAD_DIM;     // [2][BLOCK_N][HEAD_DIM]

    const Tile tile = tiles[blockIdx.x];
    const Unit u = units[tile.unit];
    const int h = blockIdx.y;
    const int kvh = h / (h_q / h_kv);
    const int p0 = u.a + tile.m_block * BLOCK_M;              // first query position of the tile
    const int p1 = min(p0 + BLOCK_M, u.e);              // one past the last valid position
    const int n_blocks = (p1 + BLOCK_N - 1) / BLOCK_N;  // key blocks 0..n_blocks-1 hold keys < p1

    const long long q_stride = (long long)h_q * HEAD_DIM;
    const long long kv_stride = (long long)h_kv * HEAD_DIM;
    const bf16_t* Qh = Q + (long long)h * HEAD_DIM;
    const bf16_t* Kh = K + (long long)kvh * HEAD_DIM;
    const bf16_t* Vh = V + (long long)kvh * HEAD_DIM;

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4; // row within the 8-row group
    const int t = lane % 4; // column pair

    // Prologue: Q tile and key block 0.
    load_tile(sQ, Qh, (long long)(u.q_off + (p0 - u.a)), p1 - p0, q_stride, BLOCK_M);
    load_tile(sK, Kh, (long long)u.kv_off, min(BLOCK_N, u.e), kv_stride, BLOCK_N);
    load_tile(sV, Vh, (long long)u.kv_off, min(BLOCK_N, u.e), kv_stride, BLOCK_N);
    cp_commit();

    u32 qf[KSTEPS][4];
    float o[DTILES][4];
#pragma unroll
    for (int d = 0; d < DTILES; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m_i[2] = {NEG_INF, NEG_INF};
    float l_i[2] = {0.f, 0.f};
    const int row_a = p0 + warp * 16 + g; // positions of this thread's two rows
    const int row_b = row_a + 8;

    for (int nb = 0; nb < n_blocks; ++nb) {
        const int buf = nb & 1;
        if (nb + 1 < n_blocks) {
            const int n1 = (nb + 1) * BLOCK_N;
            const int nxt = buf ^ 1;
            load_tile(sK + nxt * BLOCK_N * HEAD_DIM, Kh, (long long)(u.kv_off + n1),
                      min(BLOCK_N, u.e - n1), kv_stride, BLOCK_N);
            load_tile(sV + nxt * BLOCK_N * HEAD_DIM, Vh, (long long)(u.kv_off + n1),
                      min(BLOCK_N, u.e - n1), kv_stride, BLOCK_N);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();

        if (nb == 0) {
            const u32 qbase = smem_u32(sQ);
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                const int r = warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                const int c = kk * 2 + lane / 16;
                ldsm_x4(qbase + 2u * swz(r, c), qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
            }
        }

        // S = Q K^T for this warp's 16 rows x BLOCK_N keys.
        float s[NTILES][4];
#pragma unroll
        for (int j = 0; j < NTILES; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        const u32 kbase = smem_u32(sK + buf * BLOCK_N * HEAD_DIM);
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
            for (int jp = 0; jp < NTILES / 2; ++jp) {
                const int r = jp * 16 + (lane % 8) + (lane / 16) * 8;
                const int c = kk * 2 + (lane / 8) % 2;
                u32 b0, b1, b2, b3;
                ldsm_x4(kbase + 2u * swz(r, c), b0, b1, b2, b3);
                mma16816(s[2 * jp], qf[kk], b0, b1);
                mma16816(s[2 * jp + 1], qf[kk], b2, b3);
            }
        }

        // Causal mask where some key of the block lies after some query row of the tile.
        const int n0 = nb * BLOCK_N;
        if (n0 + BLOCK_N - 1 > p0) {
#pragma unroll
            for (int j = 0; j < NTILES; ++j) {
                const int col = n0 + j * 8 + 2 * t;
                if (col > row_a) s[j][0] = NEG_INF;
                if (col + 1 > row_a) s[j][1] = NEG_INF;
                if (col > row_b) s[j][2] = NEG_INF;
                if (col + 1 > row_b) s[j][3] = NEG_INF;
            }
        }

        // Online softmax (base 2): rows a (regs 0,1) and b (regs 2,3).
        float mx[2] = {m_i[0], m_i[1]};
#pragma unroll
        for (int j = 0; j < NTILES; ++j) {
            mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]) * scale_log2);
            mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]) * scale_log2);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        float corr[2], msub[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            msub[r] = (mx[r] == NEG_INF) ? 0.f : mx[r];
            corr[r] = fast_exp2(m_i[r] - msub[r]); // m_i = -inf on the first block: corr = 0
            m_i[r] = mx[r];
            l_i[r] *= corr[r];
        }
#pragma unroll
        for (int d = 0; d < DTILES; ++d) {
            o[d][0] *= corr[0];
            o[d][1] *= corr[0];
            o[d][2] *= corr[1];
            o[d][3] *= corr[1];
        }
        u32 pf[NTILES / 2][4]; // P as A fragments, one per 16-key step
#pragma unroll
        for (int j = 0; j < NTILES; ++j) {
            const float e0 = fast_exp2(s[j][0] * scale_log2 - msub[0]);
            const float e1 = fast_exp2(s[j][1] * scale_log2 - msub[0]);
            const float e2 = fast_exp2(s[j][2] * scale_log2 - msub[1]);
            const float e3 = fast_exp2(s[j][3] * scale_log2 - msub[1]);
            l_i[0] += e0 + e1;
            l_i[1] += e2 + e3;
            pf[j / 2][(j % 2) * 2 + 0] = pack_bf16(e0, e1);
            pf[j / 2][(j % 2) * 2 + 1] = pack_bf16(e2, e3);
        }

        // O += P V.
        const u32 vbase = smem_u32(sV + buf * BLOCK_N * HEAD_DIM);
#pragma unroll
        for (int kk = 0; kk < NTILES / 2; ++kk) {
#pragma unroll
            for (int dp = 0; dp < DTILES / 2; ++dp) {
                const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                const int c = dp * 2 + lane / 16;
                u32 b0, b1, b2, b3;
                ldsm_x4_t(vbase + 2u * swz(r, c), b0, b1, b2, b3);
                mma16816(o[2 * dp], pf[kk], b0, b1);
                mma16816(o[2 * dp + 1], pf[kk], b2, b3);
            }
        }
        __syncthreads(); // buffer `buf` is refilled by the next iteration's prefetch
    }

    // Finish: full row sums across the quad, normalise, write O and LSE.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_i[r] += __shfl_xor_sync(0xffffffffu, l_i[r], 1);
        l_i[r] += __shfl_xor_sync(0xffffffffu, l_i[r], 2);
    }
    const float inv[2] = {1.f / l_i[0], 1.f / l_i[1]};
    const int rows[2] = {row_a, row_b};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (rows[r] < p1) {
            const long long qrow = (long long)(u.q_off + (rows[r] - u.a));
            u32* out = reinterpret_cast<u32*>(O + qrow * q_stride + (long long)h * HEAD_DIM);
#pragma unroll
            for (int d = 0; d < DTILES; ++d) {
                out[d * 4 + t] = pack_bf16(o[d][2 * r] * inv[r], o[d][2 * r + 1] * inv[r]);
            }
            if (t == 0) {
                LSE[qrow * h_q + h] = (m_i[r] + __log2f(l_i[r])) * 0.69314718055994531f;
            }
        }
    }
}
