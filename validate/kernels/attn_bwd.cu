// Backward causal attention (dQ, dK, dV) over the same work units as attn_fwd.cu.
// attn_common.cuh is prepended by the host; compiled with -DHEAD_DIM=64|128 -DNWARPS=4
// (tiles of 64 query rows / 64 keys).
//
// FlashAttention-2 backward, split into three launches:
//   attn_bwd_dot : Dv[row, h] = sum_d dO·O                                  (one warp per row·head)
//   attn_bwd_dq  : per query tile, over its key blocks: recompute P = exp(S - LSE),
//                  dP = dO Vᵀ, dS = P∘(dP − Dv), dQ = scale·dS K           (written once, fp32)
//   attn_bwd_dkdv: per key tile of a unit, over the query blocks that see it: Pᵀ, dPᵀ = V dOᵀ,
//                  dV += Pᵀ dO, dK += scale·dSᵀ Q                            (fp32 atomics: units
//                  sharing a sample's keys and GQA query heads add into the same rows)
// LSE is the natural-log normaliser the forward kernel wrote.

#define LOG2E 1.4426950408889634f
#define POS_INF (__int_as_float(0x7f800000))

// A fragments (16 rows x HEAD_DIM) of a swizzled smem tile starting at row `row0`.
__device__ __forceinline__ void load_a(u32 base, int row0, u32 (&f)[KSTEPS][4]) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
        const int r = row0 + (lane % 8) + ((lane / 8) % 2) * 8;
        const int c = kk * 2 + lane / 16;
        ldsm_x4(base + 2u * swz(r, c), f[kk][0], f[kk][1], f[kk][2], f[kk][3]);
    }
}

// acc[16 x 64] = A[16 x D] · Bᵀ, B a swizzled smem tile of 64 rows x D (row = output column).
__device__ __forceinline__ void gemm_nt(float (&acc)[NTILES][4], const u32 (&a)[KSTEPS][4],
                                        u32 bbase) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < NTILES; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
        for (int jp = 0; jp < NTILES / 2; ++jp) {
            const int r = jp * 16 + (lane % 8) + (lane / 16) * 8;
            const int c = kk * 2 + (lane / 8) % 2;
            u32 b0, b1, b2, b3;
            ldsm_x4(bbase + 2u * swz(r, c), b0, b1, b2, b3);
            mma16816(acc[2 * jp], a[kk], b0, b1);
            mma16816(acc[2 * jp + 1], a[kk], b2, b3);
        }
    }
}

// acc[16 x D] += P[16 x 64] · B, P as bf16 A fragments, B a swizzled smem tile 64 rows x D.
__device__ __forceinline__ void gemm_nn(float (&acc)[DTILES][4], const u32 (&p)[NTILES / 2][4],
                                        u32 bbase) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < NTILES / 2; ++kk) {
#pragma unroll
        for (int dp = 0; dp < DTILES / 2; ++dp) {
            const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
            const int c = dp * 2 + lane / 16;
            u32 b0, b1, b2, b3;
            ldsm_x4_t(bbase + 2u * swz(r, c), b0, b1, b2, b3);
            mma16816(acc[2 * dp], p[kk], b0, b1);
            mma16816(acc[2 * dp + 1], p[kk], b2, b3);
        }
    }
}

// Accumulator (16 x 64, fp32) -> bf16 A fragments for the next product.
__device__ __forceinline__ void to_a(const float (&s)[NTILES][4], u32 (&p)[NTILES / 2][4]) {
#pragma unroll
    for (int j = 0; j < NTILES; ++j) {
        p[j / 2][(j % 2) * 2 + 0] = pack_bf16(s[j][0], s[j][1]);
        p[j / 2][(j % 2) * 2 + 1] = pack_bf16(s[j][2], s[j][3]);
    }
}

extern "C" __global__ void attn_bwd_dot(const bf16_t* __restrict__ O,
                                        const bf16_t* __restrict__ dO, float* __restrict__ Dv,
                                        long long rows_heads) {
    const long long w = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (w >= rows_heads) return;
    const int lane = threadIdx.x % 32;
    const bf16_t* o = O + w * HEAD_DIM;
    const bf16_t* d = dO + w * HEAD_DIM;
    float acc = 0.f;
    for (int i = lane; i < HEAD_DIM; i += 32) {
        acc += __uint_as_float((u32)o[i] << 16) * __uint_as_float((u32)d[i] << 16);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) Dv[w] = acc;
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
    attn_bwd_dq(const bf16_t* __restrict__ Q, const bf16_t* __restrict__ K,
                const bf16_t* __restrict__ V, const bf16_t* __restrict__ dO,
                const float* __restrict__ LSE, const float* __restrict__ Dv,
                float* __restrict__ dQ, const Unit* __restrict__ units,
                const Tile* __restrict__ tiles, int h_q, int h_kv, float scale) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
    bf16_t* sdO = sQ + BLOCK_M * HEAD_DIM;
    bf16_t* sK = sdO + BLOCK_M * HEAD_DIM; // [2][BLOCK_N][HEAD_DIM]
    bf16_t* sV = sK + 2 * BLOCK_N * HEAD_DIM;

    const Tile tile = tiles[blockIdx.x];
    const Unit u = units[tile.unit];
    const int h = blockIdx.y;
    const int kvh = h / (h_q / h_kv);
    const int p0 = u.a + tile.m_block * BLOCK_M;
    const int p1 = min(p0 + BLOCK_M, u.e);
    const int n_blocks = (p1 + BLOCK_N - 1) / BLOCK_N;
    const long long q_stride = (long long)h_q * HEAD_DIM;
    const long long kv_stride = (long long)h_kv * HEAD_DIM;
    const long long qrow0 = (long long)(u.q_off + (p0 - u.a));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float scale_log2 = scale * LOG2E;

    load_tile(sQ, Q + (long long)h * HEAD_DIM, qrow0, p1 - p0, q_stride, BLOCK_M);
    load_tile(sdO, dO + (long long)h * HEAD_DIM, qrow0, p1 - p0, q_stride, BLOCK_M);
    load_tile(sK, K + (long long)kvh * HEAD_DIM, (long long)u.kv_off, min(BLOCK_N, u.e),
              kv_stride, BLOCK_N);
    load_tile(sV, V + (long long)kvh * HEAD_DIM, (long long)u.kv_off, min(BLOCK_N, u.e),
              kv_stride, BLOCK_N);
    cp_commit();

    const int row_a = p0 + warp * 16 + g, row_b = row_a + 8;
    // Per-row LSE (log2 domain) and Dv; +inf LSE on rows past the unit makes their P zero.
    float lse2[2], dv[2];
    {
        const int rr[2] = {row_a, row_b};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const long long qi = (long long)(u.q_off + (rr[r] - u.a));
            lse2[r] = rr[r] < p1 ? LSE[qi * h_q + h] * LOG2E : POS_INF;
            dv[r] = rr[r] < p1 ? Dv[qi * h_q + h] : 0.f;
        }
    }
    u32 qf[KSTEPS][4], df[KSTEPS][4];
    float dq[DTILES][4];
#pragma unroll
    for (int d = 0; d < DTILES; ++d) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.f;

    for (int nb = 0; nb < n_blocks; ++nb) {
        const int buf = nb & 1;
        if (nb + 1 < n_blocks) {
            const int n1 = (nb + 1) * BLOCK_N;
            load_tile(sK + (buf ^ 1) * BLOCK_N * HEAD_DIM, K + (long long)kvh * HEAD_DIM,
                      (long long)(u.kv_off + n1), min(BLOCK_N, u.e - n1), kv_stride, BLOCK_N);
            load_tile(sV + (buf ^ 1) * BLOCK_N * HEAD_DIM, V + (long long)kvh * HEAD_DIM,
                      (long long)(u.kv_off + n1), min(BLOCK_N, u.e - n1), kv_stride, BLOCK_N);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if (nb == 0) {
            load_a(smem_u32(sQ), warp * 16, qf);
            load_a(smem_u32(sdO), warp * 16, df);
        }
        const u32 kb = smem_u32(sK + buf * BLOCK_N * HEAD_DIM);
        const u32 vb = smem_u32(sV + buf * BLOCK_N * HEAD_DIM);
        float s[NTILES][4], dp[NTILES][4];
        gemm_nt(s, qf, kb);
        gemm_nt(dp, df, vb);
        const int n0 = nb * BLOCK_N;
#pragma unroll
        for (int j = 0; j < NTILES; ++j) {
            const int col = n0 + j * 8 + 2 * t;
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const int r = x / 2;
                const int c = col + (x % 2);
                const int row = r == 0 ? row_a : row_b;
                const float p = c <= row ? fast_exp2(s[j][x] * scale_log2 - lse2[r]) : 0.f;
                s[j][x] = p * (dp[j][x] - dv[r]); // dS
            }
        }
        u32 dsf[NTILES / 2][4];
        to_a(s, dsf);
        gemm_nn(dq, dsf, kb);
        __syncthreads();
    }
    const int rr[2] = {row_a, row_b};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (rr[r] < p1) {
            float* out = dQ + (long long)(u.q_off + (rr[r] - u.a)) * q_stride +
                         (long long)h * HEAD_DIM;
#pragma unroll
            for (int d = 0; d < DTILES; ++d) {
                out[d * 8 + 2 * t] = dq[d][2 * r] * scale;
                out[d * 8 + 2 * t + 1] = dq[d][2 * r + 1] * scale;
            }
        }
    }
}

// Key tiles: Tile.unit = unit, Tile.m_block = key block (BLOCK_M keys). Grid (n_key_tiles, h_q).
extern "C" __global__ void __launch_bounds__(NTHREADS)
    attn_bwd_dkdv(const bf16_t* __restrict__ Q, const bf16_t* __restrict__ K,
                  const bf16_t* __restrict__ V, const bf16_t* __restrict__ dO,
                  const float* __restrict__ LSE, const float* __restrict__ Dv,
                  float* __restrict__ dK, float* __restrict__ dV,
                  const Unit* __restrict__ units, const Tile* __restrict__ tiles, int h_q,
                  int h_kv, float scale) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16_t* sK = reinterpret_cast<bf16_t*>(smem_raw);
    bf16_t* sV = sK + BLOCK_M * HEAD_DIM;
    bf16_t* sQ = sV + BLOCK_M * HEAD_DIM;      // [2][BLOCK_N][HEAD_DIM]
    bf16_t* sdO = sQ + 2 * BLOCK_N * HEAD_DIM; // [2][BLOCK_N][HEAD_DIM]
    float* sL = reinterpret_cast<float*>(sdO + 2 * BLOCK_N * HEAD_DIM); // [2][BLOCK_N] lse2
    float* sD = sL + 2 * BLOCK_N;                                      // [2][BLOCK_N] Dv

    const Tile tile = tiles[blockIdx.x];
    const Unit u = units[tile.unit];
    const int h = blockIdx.y;
    const int kvh = h / (h_q / h_kv);
    const int j0 = tile.m_block * BLOCK_M; // first key of the tile
    const int j1 = min(j0 + BLOCK_M, u.e);
    const long long q_stride = (long long)h_q * HEAD_DIM;
    const long long kv_stride = (long long)h_kv * HEAD_DIM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float scale_log2 = scale * LOG2E;
    // Query blocks (BLOCK_N rows, aligned to a) holding a position >= j0.
    const int qb0 = j0 > u.a ? (j0 - u.a) / BLOCK_N : 0;
    const int qb1 = (u.e - u.a + BLOCK_N - 1) / BLOCK_N;
    const bf16_t* Qh = Q + (long long)h * HEAD_DIM;
    const bf16_t* dOh = dO + (long long)h * HEAD_DIM;

    auto load_q = [&](int qb, int b) {
        const int p0 = u.a + qb * BLOCK_N;
        const int n = min(BLOCK_N, u.e - p0);
        const long long r0 = (long long)(u.q_off + qb * BLOCK_N);
        load_tile(sQ + b * BLOCK_N * HEAD_DIM, Qh, r0, n, q_stride, BLOCK_N);
        load_tile(sdO + b * BLOCK_N * HEAD_DIM, dOh, r0, n, q_stride, BLOCK_N);
        for (int i = threadIdx.x; i < BLOCK_N; i += NTHREADS) {
            sL[b * BLOCK_N + i] = i < n ? LSE[(r0 + i) * h_q + h] * LOG2E : POS_INF;
            sD[b * BLOCK_N + i] = i < n ? Dv[(r0 + i) * h_q + h] : 0.f;
        }
    };

    load_tile(sK, K + (long long)kvh * HEAD_DIM, (long long)(u.kv_off + j0), j1 - j0, kv_stride,
              BLOCK_M);
    load_tile(sV, V + (long long)kvh * HEAD_DIM, (long long)(u.kv_off + j0), j1 - j0, kv_stride,
              BLOCK_M);
    load_q(qb0, 0);
    cp_commit();

    const int key_a = j0 + warp * 16 + g, key_b = key_a + 8;
    float dk[DTILES][4], dvv[DTILES][4];
#pragma unroll
    for (int d = 0; d < DTILES; ++d) {
        dk[d][0] = dk[d][1] = dk[d][2] = dk[d][3] = 0.f;
        dvv[d][0] = dvv[d][1] = dvv[d][2] = dvv[d][3] = 0.f;
    }
    for (int qb = qb0; qb < qb1; ++qb) {
        const int buf = (qb - qb0) & 1;
        if (qb + 1 < qb1) {
            __syncthreads(); // the other buffer's LSE/Dv (plain stores) were read last round
            load_q(qb + 1, buf ^ 1);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        u32 kf[KSTEPS][4];
        load_a(smem_u32(sK), warp * 16, kf);
        const u32 qbase = smem_u32(sQ + buf * BLOCK_N * HEAD_DIM);
        const u32 dobase = smem_u32(sdO + buf * BLOCK_N * HEAD_DIM);
        float s[NTILES][4];
        gemm_nt(s, kf, qbase); // Sᵀ: keys x queries
        u32 vf[KSTEPS][4];
        load_a(smem_u32(sV), warp * 16, vf);
        float dp[NTILES][4];
        gemm_nt(dp, vf, dobase); // dPᵀ = V dOᵀ
        const int p0 = u.a + qb * BLOCK_N;
        const float* L = sL + buf * BLOCK_N;
        const float* Dd = sD + buf * BLOCK_N;
        u32 pf[NTILES / 2][4];
#pragma unroll
        for (int j = 0; j < NTILES; ++j) {
            const int ci = j * 8 + 2 * t;
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                const int c = ci + (x % 2);
                const int key = (x / 2) == 0 ? key_a : key_b;
                const float p = key <= p0 + c ? fast_exp2(s[j][x] * scale_log2 - L[c]) : 0.f;
                s[j][x] = p;
                dp[j][x] = p * (dp[j][x] - Dd[c]); // dSᵀ
            }
        }
        to_a(s, pf);
        gemm_nn(dvv, pf, dobase); // dV += Pᵀ dO
        to_a(dp, pf);
        gemm_nn(dk, pf, qbase); // dK += dSᵀ Q
        __syncthreads();
    }
    const int keys[2] = {key_a, key_b};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (keys[r] < j1) {
            const long long off = (long long)(u.kv_off + keys[r]) * kv_stride +
                                  (long long)kvh * HEAD_DIM;
#pragma unroll
            for (int d = 0; d < DTILES; ++d) {
                atomicAdd(dK + off + d * 8 + 2 * t, dk[d][2 * r] * scale);
                atomicAdd(dK + off + d * 8 + 2 * t + 1, dk[d][2 * r + 1] * scale);
                atomicAdd(dV + off + d * 8 + 2 * t, dvv[d][2 * r]);
                atomicAdd(dV + off + d * 8 + 2 * t + 1, dvv[d][2 * r + 1]);
            }
        }
    }
}
