/* cuda_layer_decode.cu — one decoder layer of one token in ONE kernel: GQA attention with q/k norm
 * and RoPE, then a routed MoE without shared experts (Qwen3-MoE shaped), NVFP4 projections and
 * experts, BF16 router.
 *
 * Why: at batch 1 the per-op kernels (cuda_decode*.cu) each spend a few microseconds in their
 * own start, drain and dependent memory round trips, ~10 of them a layer (ncu, H200, session 5:
 * ~60 us a layer for 32 MB of weights, 16.7% of the copy bandwidth). Here every SM takes part in
 * every phase of the layer, and the phases are separated by grid-wide barriers, which cost ~1.7 us
 * each on the H200 (tools/bench_grid_barrier.cu: 1.6 us at 132 blocks, 1.9 us at 528). Phases:
 *   1. every block: x = rmsnorm(h) * attn_norm into shared memory (as the CPU rounds it), then
 *      the q/k/v rows in 8-row mma tiles (cuda_decode_mma.cuh), K split inside a block;
 *   2. attn_prep of every head (q/k norm, RoPE, KV-cache write; cuda_attn_prep.cuh);
 *   3. the split decode attention (cuda_attn_decode.cuh), merged by each head group's last split;
 *   4. the output projection, added into h;
 *   5. every block: x = rmsnorm(h) * ffn_norm (kept in shared memory), router logits (a warp a row);
 *   6. every block routes the token itself (one warp, cuda_route_warp.cuh: the same ids in every
 *      block), then the gate/up tiles of the chosen experts: act = silu(gate) * up;
 *   7. the down tiles, the slots combined in ascending expert id (as the CPU), added into h.
 * Data one block writes and another reads within the launch is read with ld.global.cg (L2): an
 * SM's L1 is not coherent with the other SMs' stores. All blocks must be resident at once (the
 * barrier waits for every block): the grid is the occupancy times the SM count, launched
 * cooperatively so that the driver refuses rather than deadlocks.
 * Numbers: every step rounds as its per-op kernel does, except the router dot products and the
 * tile sums, whose fp32 summation order differs (the same order on every run).
 * Measured (session 5, Qwen3-30B-A3B NVFP4 batch 1): correct (golden qwen3_hd128_nvfp4) but
 * SLOWER than the per-op kernels, 191 against 336 tok/s, so the backend takes it only with
 * MOESERVE_LAYER_KERNEL=1. Per phase (MOESERVE_LAYER_TRACE=1) the work, not the ~1.7 us
 * barriers, is slow: ncu counts 19 M warp instructions a layer issued at 0.17 per scheduler
 * and cycle (3 warps a scheduler at 168 registers). backend_cuda.c has the figures.
 */
#include "backend/cuda/cuda_attn_decode.cuh"
#include "backend/cuda/cuda_attn_prep.cuh"
#include "backend/cuda/cuda_decode_mma.cuh"
#include "backend/cuda/cuda_route_warp.cuh"

namespace
{

enum { LD_THREADS = 128, LD_WARPS = LD_THREADS / 32, LD_MAX_K = 16 };
static_assert((int)LD_THREADS == (int)AD_THREADS,
              "the attention block runs on the layer's blocks as they are");

struct layer_params {
    int D, n_heads, n_kv, hd, E, k, I, n_splits;
    float eps;
    float *h; /* (D) the residual stream, updated */
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm;
    cuda_wdev wq, wk, wv, wo;
    const uint16_t *router; /* BF16 (E, D) */
    const float *router_bias;
    const cuda_wdev *experts; /* 3 x E: gate, up, down */
    route_warp_args ra;
    /* rope */
    int rope_dim, rope_offset, interleaved;
    float attention_factor;
    const float *inv_freq;
    const int32_t *pos, *slots;
    adec_params attn;                   /* q, kc, vc, tables, out = attn, partials, sem */
    float *qb, *kb, *vb, *logits, *act; /* q, k, v before attn_prep; logits; act */
    unsigned *bar;             /* LD_BAR_WORDS: the count (zero between barriers), copies of the generation */
    unsigned long long *trace; /* or NULL: [0] a launch counter, then LD_TRACE times per launch */
};

enum {
    LD_TRACE = 16
}; /* per launch: 8 marks of block 0 after each barrier, then per phase the
      last block's arrival at its barrier (atomicMax) */

/* Block 0 notes the time at the start and after every barrier (MOESERVE_LAYER_TRACE=1): where a
 * layer's time goes, phase by phase, as the backend reports it at the end. */
__device__ __forceinline__ void trace_mark(const layer_params &p, int &slot, int i)
{
    if (!p.trace || blockIdx.x != 0 || threadIdx.x != 0)
        return;
    if (slot < 0)
        slot = (int)atomicAdd(p.trace, 1ull);
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (slot < 4096)
        p.trace[1 + (size_t)slot * LD_TRACE + i] = t;
}

__device__ __forceinline__ unsigned ld_relaxed_u32(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* The barrier's words: the arrival count, then LD_GEN_COPIES copies of the generation, each in
 * its own 128-byte line; block b polls copy b % LD_GEN_COPIES, so that ~400 polling blocks do not
 * all load one L2 slice. Measured on the H200 against a single generation word: no difference
 * (the phases, not the barrier, are slow; see the top), kept as it costs nothing. */
enum { LD_GEN_COPIES = 32, LD_BAR_WORDS = 32 + 32 * LD_GEN_COPIES };

/* Every block of the grid arrives before any leaves; the writes before it are visible after it.
 * The last block to arrive resets the count and moves every copy of the generation on.
 * arrive (trace only): where every block notes its arrival time (atomicMax: the last one stays). */
__device__ __forceinline__ void grid_barrier(unsigned *bar, unsigned long long *arrive = nullptr)
{
    __syncthreads();
    if (threadIdx.x < 32) {
        unsigned *mine = bar + 32 + 32 * (blockIdx.x % LD_GEN_COPIES);
        unsigned gen = 0;
        bool last = false;
        if (threadIdx.x == 0) {
            if (arrive) {
                unsigned long long t;
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
                atomicMax(arrive, t);
            }
            gen = ld_relaxed_u32(mine);
            __threadfence(); /* this block's writes before the arrival */
            last = atomicAdd(bar, 1u) == gridDim.x - 1;
            if (last)
                bar[0] = 0;
        }
        last = __shfl_sync(0xffffffffu, last, 0);
        gen = __shfl_sync(0xffffffffu, gen, 0);
        if (last) {
            __threadfence();
            /* lane i moves copy i (LD_GEN_COPIES == 32) */
            asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(bar + 32 + 32 * threadIdx.x),
                         "r"(gen + 1)
                         : "memory");
        } else if (threadIdx.x == 0) {
            while (ld_relaxed_u32(mine) == gen)
                __nanosleep(32);
        }
        __syncwarp();
        __threadfence(); /* the other blocks' writes, seen after the wait */
    }
    __syncthreads();
}

/* dst[0 .. n) = src[0 .. n) through L2 (other blocks wrote src in this launch), by threads
 * tid0, tid0 + stride, ...: all of a thread's loads (up to 8 float4) are issued before the first
 * store, so a staging costs one round trip, not one per element. n % 4 == 0, both 16-byte
 * aligned. */
__device__ __forceinline__ void stage_cg(float *dst, const float *src, int n, int tid0, int stride)
{
    constexpr int B = 8;
    const float4 *s4 = (const float4 *)src;
    float4 *d4 = (float4 *)dst;
    for (int base = tid0; base < n / 4; base += B * stride) {
        float4 v[B];
#pragma unroll
        for (int b = 0; b < B; b++)
            if (base + b * stride < n / 4)
                v[b] = __ldcg(s4 + base + b * stride);
#pragma unroll
        for (int b = 0; b < B; b++)
            if (base + b * stride < n / 4)
                d4[base + b * stride] = v[b];
    }
}

/* xs[0 .. D) = rmsnorm(h) * w, rounded as cuda_norm.cu / the CPU do; h read through L2. */
__device__ __forceinline__ void block_rmsnorm(float *xs, const float *h, const float *w, float eps, int D)
{
    stage_cg(xs, h, D, threadIdx.x, blockDim.x);
    __syncthreads();
    double ss = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        ss += (double)xs[i] * xs[i];
    const float inv = dev_rms_inv(block_sum_double(ss), D, eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        xs[i] = __fmul_rn(w[i], __fmul_rn(xs[i], inv));
    __syncthreads();
}

/* y_j[0 .. N_j) (+)= x W_j^T for up to 3 NVFP4 weights sharing x (fragments xf, K): 8-row tiles,
 * a block-unit = LD_WARPS / ks tiles x ks slices of K summed in order through shared memory. */
struct gemv_jobs {
    cuda_wdev w[3];
    int64_t N[3];
    float *y[3];
    int n;
};

__device__ __forceinline__ void block_gemv(const gemv_jobs &jb, int64_t K, const uint2 *xf, int ks,
                                           bool residual)
{
    __shared__ float part[LD_WARPS][8];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
    int64_t first[4];
    first[0] = 0;
    for (int j = 0; j < jb.n; j++)
        first[j + 1] = first[j] + (jb.N[j] + 7) / 8;
    const int64_t tiles = first[jb.n];
    const int tpb = LD_WARPS / ks, s = warp % ks;
    const int64_t units = (tiles + tpb - 1) / tpb;
    const int groups = (int)(K / 128), g0 = groups * s / ks, g1 = groups * (s + 1) / ks;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const int64_t tile = u * tpb + warp / ks;
        const bool live = tile < tiles;
        int j = 0;
        while (j + 1 < jb.n && tile >= first[j + 1])
            j++;
        const int64_t n0 = (tile - first[j]) * 8, row = n0 + g;
        const cuda_wdev w = jb.w[j];
        float2 r = make_float2(0.f, 0.f);
        if (live) {
            chunk16 pre[MD_U];
            rows8_prefetch(w, row, row < jb.N[j], K, g0, g1, pre);
            r = rows8_dot_range(w, row, row < jb.N[j], K, xf, g0, g1, pre);
        }
        if (lane < 4)
            part[warp][2 * lane] = r.x, part[warp][2 * lane + 1] = r.y;
        __syncthreads();
        if (live && s == 0 && lane < 8 && n0 + lane < jb.N[j]) {
            float v = part[warp][lane];
            for (int q = 1; q < ks; q++)
                v += part[warp + q][lane];
            v = v * (0x1p62f * w.scale2) + (w.bias ? w.bias[n0 + lane] : 0.0f);
            float *dst = jb.y[j] + n0 + lane;
            *dst = residual ? __fadd_rn(__ldcg(dst), v) : v;
        }
        __syncthreads();
    }
}

/* ks for a phase: the smallest split of K whose block-units cover the grid (at most LD_WARPS, at
 * least one 128-k group a slice). */
__device__ __forceinline__ int pick_ks(int64_t tiles, int64_t K)
{
    int ks = 1;
    while (ks < LD_WARPS && (tiles * ks + LD_WARPS - 1) / LD_WARPS < (int64_t)gridDim.x && K / 128 >= 2 * ks)
        ks *= 2;
    return ks;
}

template <int NH, int NPL>
__global__ void __launch_bounds__(LD_THREADS, 3) layer_decode_kernel(const __grid_constant__ layer_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int s_ids[LD_MAX_K], s_order[LD_MAX_K];
    __shared__ float s_w[LD_MAX_K], s_part[LD_MAX_K][8];
    float *xs = (float *)smem;                                 /* (D) a normalised x */
    uint2 *xf = (uint2 *)(smem + (size_t)p.D * sizeof(float)); /* x's mma fragments, or down's act */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
    const int QD = p.n_heads * p.hd, KD = p.n_kv * p.hd;

    int slot = -1;
    trace_mark(p, slot, 0);
    /* the launch's arrival slots (trace only): launch index read back from block 0's slot is not
     * known to the other blocks, so every block counts launches itself on a second counter */
    unsigned long long *arr = nullptr;
    if (p.trace) {
        __shared__ unsigned long long s_launch;
        if (threadIdx.x == 0)
            s_launch = atomicAdd(p.trace + 1 + (size_t)4096 * LD_TRACE + blockIdx.x, 1ull);
        __syncthreads();
        if (s_launch < 4096)
            arr = p.trace + 1 + (size_t)s_launch * LD_TRACE + 8;
    }
    /* 1. q/k/v */
    xfrag_zeros_init(); /* the zero A fragments of chunk_mma, read after the next barrier */
    block_rmsnorm(xs, p.h, p.attn_norm, p.eps, p.D);
    xfrag_stage(xf, xs, p.D, threadIdx.x, LD_THREADS);
    __syncthreads();
    {
        gemv_jobs jb;
        jb.n = 3;
        jb.w[0] = p.wq, jb.w[1] = p.wk, jb.w[2] = p.wv;
        jb.N[0] = QD, jb.N[1] = KD, jb.N[2] = KD;
        jb.y[0] = p.qb, jb.y[1] = p.kb, jb.y[2] = p.vb;
        block_gemv(jb, p.D, xf, pick_ks((QD + 2 * KD) / 8, p.D), false);
    }
    grid_barrier(p.bar, arr ? arr + 0 : nullptr);
    trace_mark(p, slot, 1);

    /* 2. per-head norm + RoPE + cache write */
    for (int hh = blockIdx.x; hh < p.n_heads + 2 * p.n_kv; hh += gridDim.x) {
        attn_prep_head(p.qb, p.kb, p.vb, p.n_heads, p.n_kv, p.hd, p.q_norm, p.k_norm, p.eps, p.rope_dim,
                       p.rope_offset, p.interleaved, p.attention_factor, p.inv_freq, p.pos,
                       (float *)p.attn.kc, (float *)p.attn.vc, p.slots, 0, hh, xs);
        __syncthreads();
    }
    grid_barrier(p.bar, arr ? arr + 1 : nullptr);
    trace_mark(p, slot, 2);

    /* 3. attention: (KV head, split) units; each group's last split merges */
    for (int u = blockIdx.x; u < p.n_kv * p.n_splits; u += gridDim.x) {
        attn_split_block<NH>(p.attn, 0, u % p.n_kv, u / p.n_kv);
        __syncthreads();
    }
    grid_barrier(p.bar, arr ? arr + 2 : nullptr);
    trace_mark(p, slot, 3);

    /* 4. o projection into h */
    {
        /* the attention output through L2 (other blocks wrote it) into floats after the
         * fragments' QD * 4 bytes, then into fragments */
        float *xa = (float *)xf + QD;
        stage_cg(xa, p.attn.out, QD, threadIdx.x, LD_THREADS);
        __syncthreads();
        xfrag_stage(xf, xa, QD, threadIdx.x, LD_THREADS);
        __syncthreads();
        gemv_jobs jb;
        jb.n = 1;
        jb.w[0] = p.wo;
        jb.N[0] = p.D;
        jb.y[0] = p.h;
        block_gemv(jb, QD, xf, pick_ks(p.D / 8, QD), true);
    }
    grid_barrier(p.bar, arr ? arr + 3 : nullptr);
    trace_mark(p, slot, 4);

    /* 5. ffn norm (kept in xs for phase 6) and the router logits, a warp a row */
    block_rmsnorm(xs, p.h, p.ffn_norm, p.eps, p.D);
    for (int e = blockIdx.x * LD_WARPS + warp; e < p.E; e += gridDim.x * LD_WARPS) {
        const uint4 *row = (const uint4 *)(p.router + (size_t)e * p.D);
        float acc = 0.0f;
        constexpr int B = 8; /* a lane's 16-byte pieces, all loaded before the first FMA */
        for (int c0 = lane; c0 < p.D / 8; c0 += 32 * B) {
            uint4 wv[B];
#pragma unroll
            for (int b = 0; b < B; b++)
                if (c0 + 32 * b < p.D / 8)
                    wv[b] = __ldg(row + c0 + 32 * b);
#pragma unroll
            for (int b = 0; b < B; b++) {
                const int c = c0 + 32 * b;
                if (c >= p.D / 8)
                    break;
                const uint32_t ws[4] = {wv[b].x, wv[b].y, wv[b].z, wv[b].w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    acc = fmaf(__uint_as_float(ws[i] << 16), xs[8 * c + 2 * i], acc);
                    acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), xs[8 * c + 2 * i + 1], acc);
                }
            }
        }
        acc = warp_sum(acc);
        if (lane == 0)
            p.logits[e] = acc + (p.router_bias ? p.router_bias[e] : 0.0f);
    }
    grid_barrier(p.bar, arr ? arr + 4 : nullptr);
    trace_mark(p, slot, 5);

    /* 6. routing (every block, the same result), then gate/up of the chosen experts */
    if (warp == 0) {
        int id0 = -1, id1 = -1;
        float w0 = 0.0f, w1 = 0.0f;
        route_warp<NPL>(p.logits, p.ra, nullptr, nullptr, &id0, &w0, &id1, &w1);
        if (lane < p.k)
            s_ids[lane] = id0, s_w[lane] = w0;
        __syncwarp();
        if (lane == 0)
            slots_by_expert(s_ids, p.k, s_order);
    }
    xfrag_stage(xf, xs, p.D, threadIdx.x, LD_THREADS);
    __syncthreads();
    {
        const int tiles_per_pair = (p.I + 3) / 4; /* a warp: 4 gate + 4 up rows */
        const int units = p.k * ((tiles_per_pair + LD_WARPS - 1) / LD_WARPS);
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            const int pair = u % p.k, wt = (u / p.k) * LD_WARPS + warp;
            const int e = s_ids[pair];
            const int n0 = wt * 4;
            if (wt >= tiles_per_pair || e < 0 || e >= p.E)
                continue;
            const cuda_wdev w = g < 4 ? p.experts[e] : p.experts[p.E + e];
            const int row = n0 + (g % 4);
            const float2 r = rows8_dot(w, row, row < p.I, p.D, xf);
            const float ux = __shfl_down_sync(0xffffffffu, r.x, 2),
                        uy = __shfl_down_sync(0xffffffffu, r.y, 2);
            const cuda_wdev wu = p.experts[p.E + e];
            if (lane < 2) {
                const float sg = 0x1p62f * w.scale2, su = 0x1p62f * wu.scale2;
#pragma unroll
                for (int kk = 0; kk < 2; kk++) {
                    const int n = n0 + 2 * lane + kk;
                    if (n >= p.I)
                        continue;
                    float gv = (kk ? r.y : r.x) * sg, uv = (kk ? uy : ux) * su;
                    if (w.bias)
                        gv += w.bias[n];
                    if (wu.bias)
                        uv += wu.bias[n];
                    p.act[(size_t)pair * p.I + n] = dev_silu_mul(gv, uv);
                }
            }
        }
    }
    grid_barrier(p.bar, arr ? arr + 5 : nullptr);
    trace_mark(p, slot, 6);

    /* 7. down: a block-unit is 8 output rows, its warps take the slots; combined in expert order */
    {
        uint2 *mine = xf + (size_t)warp * (size_t)(p.I / 4) * 2;
        float *stage = (float *)(xf + (size_t)LD_WARPS * (size_t)(p.I / 4) * 2) + (size_t)warp * p.I;
        for (int u = blockIdx.x; u < (p.D + 7) / 8; u += gridDim.x) {
            const int n0 = u * 8;
            for (int j = warp; j < p.k; j += LD_WARPS) {
                const int e = s_ids[j];
                float2 r = make_float2(0.f, 0.f);
                float sc = 0.0f;
                const float *bias = nullptr;
                if (e >= 0 && e < p.E) {
                    const cuda_wdev w = p.experts[2 * p.E + e];
                    stage_cg(stage, p.act + (size_t)j * p.I, p.I, lane, 32); /* other blocks wrote act */
                    __syncwarp();
                    xfrag_stage(mine, stage, p.I, lane, 32);
                    __syncwarp();
                    r = rows8_dot(w, n0 + g, n0 + g < p.D, p.I, mine);
                    sc = 0x1p62f * w.scale2, bias = w.bias;
                }
                slot_part_put(s_part, j, r, e >= 0 && e < p.E, sc, bias, n0, p.D, lane);
                __syncwarp();
            }
            __syncthreads();
            if (threadIdx.x < 8 && n0 + threadIdx.x < p.D) {
                const int r = threadIdx.x;
                const float o = slots_combine<8>(s_ids, s_w, s_order, s_part, p.k, p.E, r);
                float *dst = p.h + n0 + r;
                *dst = __fadd_rn(__ldcg(dst), o);
            }
            __syncthreads();
        }
    }
    if (arr && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        atomicMax(arr + 6, t);
    }
    trace_mark(p, slot, 7);
}

} // namespace

/* Dynamic shared memory of the kernel: xs (D floats), then the larger of x's fragments (D * 4
 * bytes), the o projection's fragments + staged input (2 x QD * 4) and down's per-warp act
 * fragments + staged act (2 x LD_WARPS x I * 4). */
static size_t layer_smem(int D, int QD, int I)
{
    size_t a = (size_t)D * 4, b = (size_t)QD * 8, c = (size_t)LD_WARPS * (size_t)I * 8;
    size_t m = a > b ? a : b;
    return (size_t)D * 4 + (m > c ? m : c);
}

template <int NH, int NPL>
static cudaError_t layer_launch(cudaStream_t stream, const layer_params &p, int sm_count, int max_per_sm,
                                size_t smem_budget)
{
    auto kern = layer_decode_kernel<NH, NPL>;
    const size_t smem = layer_smem(p.D, p.n_heads * p.hd, p.I);
    if (smem + 4096 > smem_budget)
        return cudaErrorInvalidValue;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    int occ = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, LD_THREADS, smem);
    if (e != cudaSuccess)
        return e;
    if (occ < 1)
        return cudaErrorInvalidConfiguration;
    const int per_sm = occ < max_per_sm ? occ : max_per_sm;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative; /* refused, not deadlocked, if the grid cannot be resident */
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(sm_count * per_sm));
    cfg.blockDim = dim3(LD_THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, p);
}

extern "C" int cuda_layer_decode_supported(const struct cuda_layer_decode_args *a, size_t smem_budget)
{
    const int group = a->n_kv > 0 ? a->n_heads / a->n_kv : 0;
    return a->n_kv > 0 && a->n_heads % a->n_kv == 0 && group <= 16 && a->hd == 128 && a->D % 128 == 0 &&
           (a->n_heads * a->hd) % 128 == 0 && a->I % 128 == 0 && a->E >= 1 && a->E <= 256 && a->n_used >= 1 &&
           a->n_used <= LD_MAX_K && a->n_used <= a->E && a->n_splits >= 1 && a->n_splits <= AD_MAX_SPLITS &&
           layer_smem(a->D, a->n_heads * a->hd, a->I) + 40 * 1024 <=
               smem_budget; /* + the attention block's static arrays */
}

extern "C" cudaError_t cuda_layer_decode(cudaStream_t stream, const struct cuda_layer_decode_args *a,
                                         int sm_count, int max_per_sm, size_t smem_budget)
{
    if (!cuda_layer_decode_supported(a, smem_budget))
        return cudaErrorInvalidValue;
    layer_params p = {};
    p.D = a->D, p.n_heads = a->n_heads, p.n_kv = a->n_kv, p.hd = a->hd, p.E = a->E, p.k = a->n_used,
    p.I = a->I;
    p.n_splits = a->n_splits;
    p.eps = a->eps;
    p.h = a->h;
    p.attn_norm = a->attn_norm, p.ffn_norm = a->ffn_norm, p.q_norm = a->q_norm, p.k_norm = a->k_norm;
    p.wq = a->wq, p.wk = a->wk, p.wv = a->wv, p.wo = a->wo;
    p.router = (const uint16_t *)a->router, p.router_bias = a->router_bias;
    p.experts = a->experts;
    p.ra = route_warp_args_from(a->route);
    p.rope_dim = a->rope->dim, p.rope_offset = a->rope->offset, p.interleaved = a->rope->interleaved ? 1 : 0;
    p.attention_factor = a->rope->attention_factor, p.inv_freq = a->rope->inv_freq;
    p.pos = a->batch->pos, p.slots = a->slots;
    adec_params &ap = p.attn;
    ap.q = a->q;
    ap.kc = a->kv->k;
    ap.vc = a->kv->v;
    ap.pos = a->batch->pos;
    ap.seq = a->batch->seq;
    ap.table = a->batch->block_table;
    ap.max_blocks = a->batch->max_blocks;
    ap.block_size = a->kv->block_size;
    ap.n_kv = a->n_kv;
    ap.hd = a->hd;
    ap.n_heads = a->n_heads;
    ap.group = a->n_heads / a->n_kv;
    ap.n_splits = a->n_splits;
    ap.n_tokens = 1;
    ap.scale = a->attn_scale;
    ap.out = a->attn;
    ap.part_o = a->attn_work;
    ap.part_ml = a->attn_work + (size_t)a->n_heads * a->n_splits * a->hd;
    ap.sem = a->sem;
    p.qb = a->q, p.kb = a->k, p.vb = a->v, p.logits = a->logits, p.act = a->act;
    p.bar = a->bar;
    p.trace = a->trace;
    /* one routing width (NPL 8: up to 256 experts) keeps the fatbin to two instances of this
     * large kernel (each ~25 s of nvcc per architecture) */
    const int group = a->n_heads / a->n_kv;
    return group <= 8 ? layer_launch<8, 8>(stream, p, sm_count, max_per_sm, smem_budget)
                      : layer_launch<16, 8>(stream, p, sm_count, max_per_sm, smem_budget);
}

extern "C" size_t cuda_layer_decode_barrier_words(void)
{
    return LD_BAR_WORDS;
}

extern "C" size_t cuda_layer_decode_trace_entries(void)
{
    return 1 + (size_t)4096 * LD_TRACE + 65536; /* + per-block launch counters */
}

extern "C" int cuda_layer_decode_trace_summary(const unsigned long long *t, double out[14])
{
    int n = (int)(t[0] < 4096 ? t[0] : 4096);
    for (int i = 0; i < 14; i++)
        out[i] = 0.0;
    if (n == 0)
        return 0;
    for (int l = 0; l < n; l++) {
        const unsigned long long *m = t + 1 + (size_t)l * LD_TRACE;
        for (int i = 0; i < 6; i++) {
            out[i] += (double)((long long)(m[i + 1] - m[i])) / 1000.0; /* phase, barrier included */
            out[7 + i] +=
                (double)((long long)(m[i + 1] - m[8 + i])) / 1000.0; /* last arrival -> block 0 leaves */
        }
        /* down ends the launch, no barrier: until the last block is done */
        const unsigned long long end = m[14] > m[7] ? m[14] : m[7];
        out[6] += (double)((long long)(end - m[6])) / 1000.0;
    }
    for (int i = 0; i < 14; i++)
        out[i] /= n;
    return n;
}
