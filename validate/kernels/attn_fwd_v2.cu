// Forward causal attention, version 2: the same function, layout and work units
// as attn_fwd.cu (see there), but each warp owns 32 query rows (two 16-row MMA tiles), so every K
// or V fragment read from shared memory feeds four MMAs instead of two. The Q fragments no longer
// fit in registers next to the doubled accumulators: they are re-read from shared memory each
// k-step. Tile = BLOCK_M2 = 32*NWARPS query positions. attn_common.cuh is prepended by the host.

#define MR 2                    // 16-row MMA tiles per warp
#define BLOCK_M2 (16 * MR * NWARPS)

extern "C" __global__ void __launch_bounds__(NTHREADS)
    attn_fwd_v2(const bf16_t* __restrict__ Q, const bf16_t* __restrict__ K,
                const bf16_t* __restrict__ V, bf16_t* __restrict__ O, float* __restrict__ LSE,
                const Unit* __restrict__ units, const Tile* __restrict__ tiles, int h_q, int h_kv,
                float scale_log2) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
    bf16_t* sK = sQ + BLOCK_M2 * HEAD_DIM;     // [2][BLOCK_N][HEAD_DIM]
    bf16_t* sV = sK + 2 * BLOCK_N * HEAD_DIM;  // [2][BLOCK_N][HEAD_DIM]

    const Tile tile = tiles[blockIdx.x];
    const Unit u = units[tile.unit];
    const int h = blockIdx.y;
    const int kvh = h / (h_q / h_kv);
    const int p0 = u.a + tile.m_block * BLOCK_M2;
    const int p1 = min(p0 + BLOCK_M2, u.e);
    const int n_blocks = (p1 + BLOCK_N - 1) / BLOCK_N;

    const long long q_stride = (long long)h_q * HEAD_DIM;
    const long long kv_stride = (long long)h_kv * HEAD_DIM;
    const bf16_t* Qh = Q + (long long)h * HEAD_DIM;
    const bf16_t* Kh = K + (long long)kvh * HEAD_DIM;
    const bf16_t* Vh = V + (long long)kvh * HEAD_DIM;

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;

    load_tile(sQ, Qh, (long long)(u.q_off + (p0 - u.a)), p1 - p0, q_stride, BLOCK_M2);
    load_tile(sK, Kh, (long long)u.kv_off, min(BLOCK_N, u.e), kv_stride, BLOCK_N);
    load_tile(sV, Vh, (long long)u.kv_off, min(BLOCK_N, u.e), kv_stride, BLOCK_N);
    cp_commit();

    float o[MR][DTILES][4];
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
        for (int d = 0; d < DTILES; ++d) o[mi][d][0] = o[mi][d][1] = o[mi][d][2] = o[mi][d][3] = 0.f;
    float m_i[MR][2], l_i[MR][2];
#pragma unroll
    for (int mi = 0; mi < MR; ++mi) {
        m_i[mi][0] = m_i[mi][1] = NEG_INF;
        l_i[mi][0] = l_i[mi][1] = 0.f;
    }
    const int wrow0 = p0 + warp * 16 * MR; // first position of this warp's rows
    const u32 qbase = smem_u32(sQ);

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

        const int n0 = nb * BLOCK_N;
        // A warp whose rows all precede the block's first key has nothing to do here (its rows
        // are past the tile's valid end or the block lies wholly in its future).
        if (n0 <= wrow0 + 16 * MR - 1) {
            float s[MR][NTILES][4];
#pragma unroll
            for (int mi = 0; mi < MR; ++mi)
#pragma unroll
                for (int j = 0; j < NTILES; ++j) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.f;
            const u32 kbase = smem_u32(sK + buf * BLOCK_N * HEAD_DIM);
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                u32 qa[MR][4];
#pragma unroll
                for (int mi = 0; mi < MR; ++mi) {
                    const int r = warp * 16 * MR + mi * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                    const int c = kk * 2 + lane / 16;
                    ldsm_x4(qbase + 2u * swz(r, c), qa[mi][0], qa[mi][1], qa[mi][2], qa[mi][3]);
                }
#pragma unroll
                for (int jp = 0; jp < NTILES / 2; ++jp) {
                    const int r = jp * 16 + (lane % 8) + (lane / 16) * 8;
                    const int c = kk * 2 + (lane / 8) % 2;
                    u32 b0, b1, b2, b3;
                    ldsm_x4(kbase + 2u * swz(r, c), b0, b1, b2, b3);
#pragma unroll
                    for (int mi = 0; mi < MR; ++mi) {
                        mma16816(s[mi][2 * jp], qa[mi], b0, b1);
                        mma16816(s[mi][2 * jp + 1], qa[mi], b2, b3);
                    }
                }
            }

            u32 pf[MR][NTILES / 2][4];
#pragma unroll
            for (int mi = 0; mi < MR; ++mi) {
                const int row_a = wrow0 + mi * 16 + g;
                const int row_b = row_a + 8;
                if (n0 + BLOCK_N - 1 > wrow0 + mi * 16) {
#pragma unroll
                    for (int j = 0; j < NTILES; ++j) {
                        const int col = n0 + j * 8 + 2 * t;
                        if (col > row_a) s[mi][j][0] = NEG_INF;
                        if (col + 1 > row_a) s[mi][j][1] = NEG_INF;
                        if (col > row_b) s[mi][j][2] = NEG_INF;
                        if (col + 1 > row_b) s[mi][j][3] = NEG_INF;
                    }
                }
                float mx[2] = {m_i[mi][0], m_i[mi][1]};
#pragma unroll
                for (int j = 0; j < NTILES; ++j) {
                    mx[0] = fmaxf(mx[0], fmaxf(s[mi][j][0], s[mi][j][1]) * scale_log2);
                    mx[1] = fmaxf(mx[1], fmaxf(s[mi][j][2], s[mi][j][3]) * scale_log2);
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
                    corr[r] = fast_exp2(m_i[mi][r] - msub[r]);
                    m_i[mi][r] = mx[r];
                    l_i[mi][r] *= corr[r];
                }
#pragma unroll
                for (int d = 0; d < DTILES; ++d) {
                    o[mi][d][0] *= corr[0];
                    o[mi][d][1] *= corr[0];
                    o[mi][d][2] *= corr[1];
                    o[mi][d][3] *= corr[1];
                }
#pragma unroll
                for (int j = 0; j < NTILES; ++j) {
                    const float e0 = fast_exp2(s[mi][j][0] * scale_log2 - msub[0]);
                    const float e1 = fast_exp2(s[mi][j][1] * scale_log2 - msub[0]);
                    const float e2 = fast_exp2(s[mi][j][2] * scale_log2 - msub[1]);
                    const float e3 = fast_exp2(s[mi][j][3] * scale_log2 - msub[1]);
                    l_i[mi][0] += e0 + e1;
                    l_i[mi][1] += e2 + e3;
                    pf[mi][j / 2][(j % 2) * 2 + 0] = pack_bf16(e0, e1);
                    pf[mi][j / 2][(j % 2) * 2 + 1] = pack_bf16(e2, e3);
                }
            }

            const u32 vbase = smem_u32(sV + buf * BLOCK_N * HEAD_DIM);
#pragma unroll
            for (int kk = 0; kk < NTILES / 2; ++kk) {
#pragma unroll
                for (int dp = 0; dp < DTILES / 2; ++dp) {
                    const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                    const int c = dp * 2 + lane / 16;
                    u32 b0, b1, b2, b3;
                    ldsm_x4_t(vbase + 2u * swz(r, c), b0, b1, b2, b3);
#pragma unroll
                    for (int mi = 0; mi < MR; ++mi) {
                        mma16816(o[mi][2 * dp], pf[mi][kk], b0, b1);
                        mma16816(o[mi][2 * dp + 1], pf[mi][kk], b2, b3);
                    }
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int mi = 0; mi < MR; ++mi) {
        float l[2] = {l_i[mi][0], l_i[mi][1]};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = wrow0 + mi * 16 + g + 8 * r;
            if (row < p1) {
                const float inv = 1.f / l[r];
                const long long qrow = (long long)(u.q_off + (row - u.a));
                u32* out = reinterpret_cast<u32*>(O + qrow * q_stride + (long long)h * HEAD_DIM);
#pragma unroll
                for (int d = 0; d < DTILES; ++d) {
                    out[d * 4 + t] = pack_bf16(o[mi][d][2 * r] * inv, o[mi][d][2 * r + 1] * inv);
                }
                if (t == 0) {
                    LSE[qrow * h_q + h] = (m_i[mi][r] + __log2f(l[r])) * 0.69314718055994531f;
                }
            }
        }
    }
}
