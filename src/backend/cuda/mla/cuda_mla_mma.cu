/* cuda_mla_mma.cu — MLA attention in latent space on bf16 tensor cores, over a bf16 latent cache.
 *
 * The same contract as cuda_mla.cu's fp32 kernel (backend_ops.mla_attention): every head of a
 * token attends to the token's keys (its DSA selection, or 0..pos) through the one cached latent
 * row [c_kv | k_r] per key, the values being the c_kv part of the same row. Multi-query attention
 * with 64 heads on a 576-wide row is a pair of small matrix products per key tile, which is what
 * this kernel gives the tensor cores:
 *   S[heads, keys] = Q[heads, Dk] K[keys, Dk]^T,   O[heads, R] += softmax(S) K[keys, :R].
 * A block takes `rows` heads of ONE token (16 a warp pair) and a contiguous share of its keys
 * (split-K: the partials merge in cuda_mla_merge(), as the fp32 kernel's do). Each warp pair
 * shares a 16-head row group: both compute its S (cheap, and the softmax stays inside a warp),
 * each accumulates one half of the R value columns in registers. The key tiles come into shared
 * memory by cp.async straight from the bf16 cache (gathered by index under DSA), double-buffered
 * where the budget holds two.
 *
 * Precision: the keys and values are the cache's bf16 values exactly; the query and the softmax
 * weights are split into bf16 hi + lo (two MMAs each), so the result is fp32-grade (~1e-5 of the
 * fp32 kernel on the same cache) and does not depend on how the keys were split.
 *
 * Shared memory (bf16): Qhi[rows][ld], Qlo[rows][ld], K[stages][keys][ld], ld = Dk rounded up to
 * 16, + 8 (the ldmatrix rows then fall in distinct banks); plan_mla_mma_smem() is the formula.
 */
#include "backend/cuda/mla/mla.h"
#include <math.h>

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/common/cuda_mma.cuh"
#include "backend/cuda/mla/cuda_latent.cuh"
extern "C" {
#include "plan/plan.h"
}

namespace
{

constexpr int MAX_VT = 32; /* value n-tiles (8 columns) per warp: R / 2 <= 256 */
constexpr int Q_BATCH = 16; /* query loads a thread keeps in flight while staging */

struct mma_params {
    const float *q;         /* (T, H, Dk) */
    const uint16_t *latent; /* (slots, Dk) bf16 */
    const int32_t *sel;     /* (T, sel_k) or NULL */
    int sel_k;
    const int32_t *pos, *seq, *table;
    int max_blocks, block_size;
    int n_tokens, H, Dk, R;
    int rows, stages, head_blocks, ld;
    float scale;
    int n_splits;
    float *out;  /* (T, H, R) when n_splits == 1 */
    float *part; /* (n_splits, T, H, R + 2) otherwise: m, l, unnormalised O */
};

/* grid (T * head_blocks, n_splits), (rows / 16) * 2 warps; TN keys per tile. One function past
 * 100 lines: the O accumulators (up to 128 registers a thread) live through every phase of the
 * tile loop (load, S, softmax, P V), which reads best, and compiles best, in one piece. */
template <int TN>
__global__ void __launch_bounds__(256) mla_mma_kernel(mma_params p)
{
    extern __shared__ __align__(16) uint16_t sm[];
    const int ld = p.ld, RW = p.rows;
    uint16_t *Qh = sm, *Ql = Qh + (size_t)RW * ld, *Kb = Ql + (size_t)RW * ld;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = (warp >> 1) * 16, vh = warp & 1;
    const int t = blockIdx.x / p.head_blocks, h0 = (blockIdx.x % p.head_blocks) * RW, split = blockIdx.y;
    const int nh = p.H - h0 < RW ? p.H - h0 : RW;
    const int pos = p.pos[t];
    const int n_keys = p.sel ? (pos + 1 < p.sel_k ? pos + 1 : p.sel_k) : pos + 1;
    int lo = 0, hi = n_keys;
    if (p.n_splits > 1) {
        int chunk = (n_keys + p.n_splits - 1) / p.n_splits;
        chunk = (chunk + TN - 1) / TN * TN; /* whole tiles: fewer, fuller blocks */
        lo = split * chunk < n_keys ? split * chunk : n_keys;
        hi = lo + chunk < n_keys ? lo + chunk : n_keys;
    }
    const int Dk = p.Dk, ksteps = (Dk + 15) / 16, cpr = Dk / 8, q4 = ld / 4;
    /* the queries as hi + lo, 4 values a load, Q_BATCH loads a thread in flight before their
     * stores (a block stages 37-74 KB from L2: ~36 loads a thread at 32 rows and 128 threads) */
    for (int base = threadIdx.x; base < RW * q4; base += Q_BATCH * blockDim.x) {
        float4 v[Q_BATCH];
#pragma unroll
        for (int u = 0; u < Q_BATCH; u++) {
            const int i = base + u * blockDim.x, r = i / q4, d = (i % q4) * 4;
            v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < RW * q4 && r < nh && d < Dk)
                v[u] = __ldg((const float4 *)(p.q + ((size_t)t * p.H + h0 + r) * Dk + d));
        }
#pragma unroll
        for (int u = 0; u < Q_BATCH; u++) {
            const int i = base + u * blockDim.x, r = i / q4, d = (i % q4) * 4;
            if (i >= RW * q4)
                break;
            uint32_t h0w, l0w, h1w, l1w;
            mma_split_bf16x2(v[u].x, v[u].y, h0w, l0w);
            mma_split_bf16x2(v[u].z, v[u].w, h1w, l1w);
            *(uint2 *)(Qh + (size_t)r * ld + d) = make_uint2(h0w, h1w);
            *(uint2 *)(Ql + (size_t)r * ld + d) = make_uint2(l0w, l1w);
        }
    }
    /* the key rows' pad columns past Dk are never loaded: zero once */
    for (int i = threadIdx.x; i < p.stages * TN * (ld - Dk); i += blockDim.x)
        Kb[(size_t)(i / (ld - Dk)) * ld + Dk + i % (ld - Dk)] = 0;
    __syncthreads();

    const int32_t *blocks = p.table + (size_t)p.seq[t] * p.max_blocks;
    const int32_t *sel = p.sel ? p.sel + (size_t)t * p.sel_k : nullptr;
    auto load = [&](int k0, int buf) {
        const int nk = hi - k0 < TN ? hi - k0 : TN;
        uint16_t *dst = Kb + (size_t)buf * TN * ld;
        /* a short tile's missing rows: zeros (weight 0 times whatever the buffer held could be NaN) */
        for (int i = threadIdx.x; i < (TN - nk) * cpr; i += blockDim.x)
            *(uint4 *)(dst + (size_t)(nk + i / cpr) * ld + (i % cpr) * 8) = make_uint4(0, 0, 0, 0);
        for (int i = threadIdx.x; i < nk * cpr; i += blockDim.x) {
            int jj = i / cpr, c = i % cpr, kp = sel ? sel[k0 + jj] : k0 + jj;
            if (kp < 0) { /* -1 padding: masked below, zeros meanwhile */
                *(uint4 *)(dst + (size_t)jj * ld + c * 8) = make_uint4(0, 0, 0, 0);
                continue;
            }
            size_t slot = (size_t)blocks[kp / p.block_size] * p.block_size + (size_t)(kp % p.block_size);
            cp_async16(dst + (size_t)jj * ld + c * 8, p.latent + slot * Dk + c * 8);
        }
        cp_async_commit();
    };

    float o[MAX_VT][4];
#pragma unroll
    for (int j = 0; j < MAX_VT; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f; /* rows lane/4 and lane/4 + 8 */
    const int vt = p.R / 16, vcol = vh * (p.R / 2);
    const int n_tiles = (hi - lo + TN - 1) / TN;
    if (n_tiles > 0)
        load(lo, 0);
    for (int it = 0; it < n_tiles; it++) {
        const int k0 = lo + it * TN, buf = p.stages > 1 ? (it & 1) : 0;
        const int nk = hi - k0 < TN ? hi - k0 : TN;
        if (p.stages > 1 && it + 1 < n_tiles) {
            load(k0 + TN, buf ^ 1); /* the next tile streams in under this one */
            cp_async_wait_upto(1);
        } else {
            if (p.stages == 1 && it > 0)
                load(k0, 0); /* one buffer: this tile now (the previous one is consumed) */
            cp_async_wait_upto(0);
        }
        __syncthreads();
        const uint16_t *K = Kb + (size_t)buf * TN * ld;

        float s[TN / 8][4];
#pragma unroll
        for (int n = 0; n < TN / 8; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 2 /* the next step's ldmatrix issues under this step's MMAs */
        for (int kk = 0; kk < ksteps; kk++) {
            uint32_t ah[4], al[4];
            const size_t qo = (size_t)(r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + kk * 16 + (lane >> 4) * 8;
            mma_ldsm_x4(ah, Qh + qo);
            mma_ldsm_x4(al, Ql + qo);
#pragma unroll
            for (int n2 = 0; n2 < TN / 16; n2++) {
                uint32_t b[4];
                mma_ldsm_x4(b, K + (size_t)(n2 * 16 + (lane & 7) + (lane >> 4) * 8) * ld + kk * 16 +
                                   ((lane >> 3) & 1) * 8);
                mma_bf16_16816(s[2 * n2], al, b[0], b[1]);
                mma_bf16_16816(s[2 * n2], ah, b[0], b[1]);
                mma_bf16_16816(s[2 * n2 + 1], al, b[2], b[3]);
                mma_bf16_16816(s[2 * n2 + 1], ah, b[2], b[3]);
            }
        }
        /* online softmax over this tile; the 4 lanes of a row reduce by shuffles */
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int n = 0; n < TN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = n * 8 + 2 * (lane & 3) + (e & 1);
                const bool ok = key < nk && (!sel || sel[k0 + key] >= 0);
                const float v = ok ? s[n][e] * p.scale : -INFINITY;
                s[n][e] = v;
                if (e < 2)
                    mx_a = fmaxf(mx_a, v);
                else
                    mx_b = fmaxf(mx_b, v);
            }
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
        const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
        const float al_a = mn_a == -INFINITY ? 1.0f : expf(m_a - mn_a);
        const float al_b = mn_b == -INFINITY ? 1.0f : expf(m_b - mn_b);
        float ps_a = 0.0f, ps_b = 0.0f;
#pragma unroll
        for (int n = 0; n < TN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float mref = e < 2 ? mn_a : mn_b;
                const float pv = s[n][e] == -INFINITY ? 0.0f : expf(s[n][e] - mref);
                s[n][e] = pv;
                if (e < 2)
                    ps_a += pv;
                else
                    ps_b += pv;
            }
        l_a = l_a * al_a + ps_a;
        l_b = l_b * al_b + ps_b;
        m_a = mn_a, m_b = mn_b;
#pragma unroll
        for (int j = 0; j < MAX_VT; j++) {
            o[j][0] *= al_a, o[j][1] *= al_a;
            o[j][2] *= al_b, o[j][3] *= al_b;
        }
        /* O += P V: P's accumulator layout is the A fragment's, 16 keys a step */
#pragma unroll
        for (int k2 = 0; k2 < TN / 16; k2++) {
            uint32_t ph[4], pl[4];
            mma_split_bf16x2(s[2 * k2][0], s[2 * k2][1], ph[0], pl[0]);
            mma_split_bf16x2(s[2 * k2][2], s[2 * k2][3], ph[1], pl[1]);
            mma_split_bf16x2(s[2 * k2 + 1][0], s[2 * k2 + 1][1], ph[2], pl[2]);
            mma_split_bf16x2(s[2 * k2 + 1][2], s[2 * k2 + 1][3], ph[3], pl[3]);
            const uint16_t *vrow = K + (size_t)(k2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + vcol + (lane >> 4) * 8;
#pragma unroll
            for (int j = 0; j < MAX_VT; j += 2) {
                if (j >= vt)
                    break;
                uint32_t b[4];
                mma_ldsm_x4_trans(b, vrow + j * 8);
                mma_bf16_16816(o[j], pl, b[0], b[1]);
                mma_bf16_16816(o[j], ph, b[0], b[1]);
                if (j + 1 < vt) {
                    mma_bf16_16816(o[j + 1], pl, b[2], b[3]);
                    mma_bf16_16816(o[j + 1], ph, b[2], b[3]);
                }
            }
        }
        __syncthreads(); /* this buffer is consumed before a later load refills it */
    }
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    const int ra = r0 + lane / 4, rb = ra + 8, R = p.R;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = half ? rb : ra;
        if (r >= nh)
            continue;
        const float m = half ? m_b : m_a, l = half ? l_b : l_a;
        const size_t th = (size_t)t * p.H + h0 + r;
        float *dst = p.n_splits == 1 ? p.out + th * R : p.part + ((size_t)split * p.n_tokens * p.H + th) * (R + 2) + 2;
        const float inv = p.n_splits == 1 ? 1.0f / l : 1.0f;
#pragma unroll
        for (int j = 0; j < MAX_VT; j++) {
            if (j >= vt)
                break;
            const int col = vcol + j * 8 + 2 * (lane & 3);
            dst[col] = o[j][half * 2] * inv;
            dst[col + 1] = o[j][half * 2 + 1] * inv;
        }
        if (p.n_splits > 1 && vh == 0 && (lane & 3) == 0) {
            dst[-2] = m;
            dst[-1] = l;
        }
    }
}

} // namespace

extern "C" int cuda_mla_mma_fits(int n_heads, int k_dim, int v_dim, int rows, int keys, int stages, size_t budget)
{
    return n_heads > 0 && k_dim > v_dim && k_dim % 8 == 0 && v_dim % 16 == 0 && v_dim <= 16 * MAX_VT &&
           (rows == 16 || rows == 32 || rows == 64) && (keys == 16 || keys == 32 || keys == 64) &&
           (stages == 1 || stages == 2) && plan_mla_mma_smem(rows, keys, k_dim, stages) + 256 <= budget;
}

extern "C" cudaError_t cuda_mla_attention_mma(cudaStream_t stream, const float *q_abs, const struct paged_latent *kv,
                                              const struct attn_batch *b, int n_heads, const int32_t *sel,
                                              int sel_k, float scale, float *o_lat, int rows, int keys, int stages,
                                              int n_splits, float *work)
{
    if (b->n_tokens <= 0)
        return cudaSuccess;
    mma_params p;
    latent_params_fill(p, q_abs, kv, b, n_heads, sel, sel_k, scale, n_splits, o_lat, work);
    p.latent = (const uint16_t *)kv->latent;
    p.rows = rows;
    p.stages = stages;
    p.head_blocks = (n_heads + rows - 1) / rows;
    p.ld = plan_mla_mma_ld(p.Dk);
    int64_t blocks = (int64_t)b->n_tokens * p.head_blocks;
    if (kv->dtype != KV_DTYPE_BF16 || n_splits < 1 || n_splits > PLAN_ATTN_MAX_SPLITS || (n_splits > 1 && !work) ||
        (sel && sel_k < 1) || blocks > 0x7fffffff || !cuda_mla_mma_fits(n_heads, p.Dk, p.R, rows, keys, stages, ~(size_t)0))
        return cudaErrorInvalidValue;
    size_t smem = plan_mla_mma_smem(rows, keys, p.Dk, stages);
    void (*kernel)(mma_params) = keys == 16 ? mla_mma_kernel<16> : keys == 32 ? mla_mma_kernel<32> : mla_mma_kernel<64>;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    dim3 grid((unsigned)blocks, (unsigned)n_splits);
    kernel<<<grid, (unsigned)(rows / 16 * 64), smem, stream>>>(p);
    if (n_splits > 1) {
        e = cudaGetLastError();
        if (e != cudaSuccess)
            return e;
        return cuda_mla_merge(stream, work, n_splits, b->n_tokens * n_heads, p.R, o_lat);
    }
    return CUDA_LAUNCH_RESULT();
}
