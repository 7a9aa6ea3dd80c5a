/* cuda_decode_mma.cu — few-token NVFP4 decode on bf16 tensor cores (mma.sync m16n8k16, sm_80 and
 * later): the MoE pair kernels and a one-token GEMV.
 *
 * Why: the register kernels of cuda_decode.cu decode each E2M1 weight with 3 integer ops and
 * multiply it with one FMA; on the H200 that arithmetic, not DRAM, bounds them (ncu: ~0.6 issued
 * warps per scheduler with the weights already in L2). Here a warp takes 8 weight rows as the
 * B operand (n = 8), x as the A operand (row 0: x rounded to bf16, row 8: the remainder
 * x - hi rounded again, the other rows zero), so the tensor core does the multiply-adds and the
 * lanes only build bf16 pairs:
 *  - two E2M1 nibbles four apart in a 32-bit word (i and i + 4) land in the two halves of a
 *    bf16x2 with one shift for the magnitudes, one for the signs and one LOP3: (e1 e0 m) at bits
 *    8..6 is the value times 2^-126 (0.5 becomes the bf16 subnormal 2^-127);
 *  - one bf16x2 FMA by the E4M3 block scale times 2^64 makes them the exact products (at most
 *    6 significant bits) times 2^-62, all normal;
 *  - the sum comes back with 2^62 and the global scale in fp32.
 * ~2.4 instructions a weight instead of ~4.6. Precision is that of the fp32 paths: x's hi + lo
 * carry ~16 bits and every product is exact with fp32 accumulation.
 *
 * Layout of a step: lane (g, t) = (lane / 4, lane % 4) holds row g's 16-byte chunk c = t + 4i
 * (32 nibbles: 8 k-steps of 4). Step (word w, half h) feeds the logical k slots 2t, 2t+1 from
 * nibbles 2h, 2h+4 of word w and slots 2t+8, 2t+9 from nibbles 2h+1, 2h+5; x is staged in
 * shared memory already in A-fragment order for the same mapping (xfrag_stage), one 16-byte load
 * per mma for lanes 0..3 and a shared zero block for the rest. Row g's sum ends up in lanes 0..3
 * (rows 2t, 2t+1; C rows 0 and 8 are the hi and lo halves, added in the lane).
 * Kernels: gate/up (a warp: 4 gate + 4 up rows of one pair, silu(g) * u written by lanes 0-1)
 * and down (a warp per slot, 8 output rows, the slots added in ascending expert id as the CPU
 * does). One wave for Qwen3-30B-A3B at one token: 384 gate/up blocks of 128 threads and 256 down
 * blocks of 256. Both beat cuda_decode.cu's pair kernels at 1 and 8 tokens (H200,
 * docs/lab/journal.md).
 * gemv_mma (1-8 tokens, up to 3 weights, K split over warps until every SM has a block; all of a
 * warp's weight groups loaded before the PDL wait): beats cuda_decode.cu's gemv1, whose dot after
 * the wait is bound by instruction issue (H200, docs/lab/journal.md).
 */
#include "backend/cuda/decode/decode.h"
#include "backend/cuda/decode/cuda_decode_mma.cuh"
#include "backend/cuda/common/cuda_ktrace.cuh"

KT_MODULE(decode_mma, "moe_gate_up_mma", "moe_down_mma", "gemv_mma")

namespace
{

/* act[pair, n] = silu(x G_e[n]) * (x U_e[n]); grid (I / 16, pairs); a warp's row tile: rows n0
 * .. n0 + 3 of gate (lanes' g 0..3) and of up (g 4..7) over the whole K. Blocks of 4 warps:
 * Qwen3-30B-A3B's gate/up at one token is 384 of them, that spread 2-3 to an SM where 192 blocks
 * of 8 warps would leave 60 SMs with twice the work of the other 72. Two warps splitting a tile's
 * K (to shorten each warp's chain of ~160 instructions a 32-k chunk) are slower (H200, batch 1:
 * 352.6 vs 358.4 tok/s, docs/lab/journal.md). */
enum { MOE_SMEM_BATCH = 4 };
/* MOE_U: weight groups a gate/up warp of the register form keeps in flight (4 and 16 are slower,
 * docs/lab/experiments.md). */
enum { MOE_U = 8 };

/* A gate/up warp's end (silu_pair_store): the up weight's scale and bias come from lane 16
 * (g = 4 holds the up entry), no table read at the tail. */
__device__ __forceinline__ void gate_up_finish(float2 r, const cuda_wdev &w, int64_t n0, int64_t I, float *out,
                                               int lane)
{
    const float u_scale2 = __shfl_sync(0xffffffffu, w.scale2, 16);
    const float *u_bias = (const float *)__shfl_sync(0xffffffffu, (unsigned long long)w.bias, 16);
    silu_pair_store(r, 0x1p62f * w.scale2, 0x1p62f * u_scale2, w.bias, u_bias, n0, I, out, lane);
}

/* SM: the weights go through shared memory (rows8_stage_async: all of a warp's groups in flight
 * at once, few registers), the kernel triggers its dependent right after its wait, and the
 * dynamic shared memory holds x's fragments then MG_WARPS areas of D / 128 groups. !SM: the
 * weights in registers, MOE_U groups in flight. */
template <bool SM>
__global__ void __launch_bounds__(MG_THREADS, SM ? 8 : 5)
    moe_gate_up_mma_kernel(const cuda_wdev *table, int n_experts, int64_t I, int64_t D, const float *x,
                           const int32_t *ids, int n_used, int shared_e, float *act)
{
    extern __shared__ uint2 xf[];
    KT_BEGIN();
    pdl_wait();
    if (SM) /* one wave: no later block of this kernel needs the slots */
        pdl_trigger();
    KT_MARK(1);
    /* a token's slots: its n_used routed experts, then the shared expert (table index shared_e)
     * where there is one */
    const int pair = blockIdx.y, slots = n_used + (shared_e >= 0), tok = pair / slots, slot = pair % slots;
    const int lane = threadIdx.x % 32, g = lane / 4, wib = threadIdx.x / 32;
    const int e = slot < n_used ? ids[(size_t)tok * n_used + slot] : shared_e;
    const int64_t n0 = ((int64_t)blockIdx.x * MG_WARPS + wib) * 4;
    float *out = act + (size_t)pair * (size_t)I;
    if (e < 0 || e >= n_experts) { /* no expert: contributes nothing (down skips it too) */
        if (lane < 4 && n0 + lane < I)
            out[n0 + lane] = 0.0f;
        return;
    }
    const cuda_wdev w = g < 4 ? table[e] : table[n_experts + e];
    const int64_t row = n0 + (g % 4);
    const int G = (int)(D / 128);
    float2 r;
    if constexpr (SM) {
        uint8_t *area = (uint8_t *)xf + (size_t)D * 4 + (size_t)wib * (size_t)G * RS8_GROUP_BYTES;
        int commits = 0;
        xfrag_zeros_init();
        xfrag_stage_around<4>(
            xf, x + (size_t)tok * (size_t)D, (int)D, threadIdx.x, MG_THREADS,
            [&] { commits = rows8_stage_async(w, row, row < I, D, 0, G, area, MOE_SMEM_BATCH); });
        __syncthreads();
        KT_MARK(2);
        r = rows8_dot_smem(area, xf, 0, G, MOE_SMEM_BATCH, commits);
    } else {
        /* the first MOE_U weight groups in flight while x is staged, asked for after x */
        chunk16 pre[MOE_U];
        xfrag_zeros_init();
        xfrag_stage_around<4>(xf, x + (size_t)tok * (size_t)D, (int)D, threadIdx.x, MG_THREADS,
                              [&] { rows8_prefetch<MOE_U>(w, row, row < I, D, 0, G, pre); });
        __syncthreads();
        KT_MARK(2);
        r = rows8_dot_range<MOE_U>(w, row, row < I, D, xf, 0, G, pre);
    }
    KT_MARK(3);
    pdl_trigger(); /* late: see pdl_trigger() */
    gate_up_finish(r, w, n0, I, out, lane);
    KT_END(decode_mma, 0);
}

/* out[t, d] = sum over the token's slots in ascending expert id of w * (act_pair D_e[d]); grid
 * (D / (8 TPW), tokens); warp j takes slots j, j + 8, ... for the block's TPW 8-row tiles, its
 * slot's activations staged once for all of them. More tiles a block where one tile a block would
 * be several short waves (GLM-5's D 6144: 768 blocks at 2 an SM): each block's staging of 8 slots'
 * activations (as many bytes as the weights a tile reads) and its start are paid once a TPW.
 * shared_e >= 0: the token's slot n_used is the shared expert (weight 1, added after the routed
 * slots, as the forward adds its MLP); its K is split over the block's warps (slot n_used alone
 * on one warp would double that warp's chain: GLM-5 has 8 routed slots for 8 warps), the
 * warps' partials added in warp order. */
template <int TPW>
__global__ void __launch_bounds__(MD_THREADS, 2)
    moe_down_mma_kernel(const cuda_wdev *table, int n_experts, int64_t D, int64_t I, const float *act,
                        const int32_t *ids, const float *weights, int n_used, int shared_e, float *out)
{
    extern __shared__ uint2 xf[];
    __shared__ int order[MD_MAX_USED], s_ids[MD_MAX_USED];
    __shared__ float part[TPW][MD_MAX_USED][8], s_w[MD_MAX_USED], part_sh[TPW][MD_WARPS][8];
    KT_BEGIN();
    xfrag_zeros_init();
    const int t = blockIdx.y;
    const int64_t n0 = (int64_t)blockIdx.x * 8 * TPW;
    const int wib = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, GI = (int)(I / 128);
    /* at most 6 groups in flight (a 768-wide row: all of it): with act's 6 entries a lane held
     * across the weight loads, 8 spill */
    constexpr int UD = 6;
    chunk16 pre[UD]; /* in flight while a slot's act is staged (asked for after act) */
    pdl_wait();
    /* the token's routing into shared memory once (the slot loop, the sort and the combine at
     * the tail read it there) */
    slots_load(ids, weights, t, n_used, s_ids, s_w, order);
    KT_MARK(1);
    uint2 *mine = xf + (size_t)wib * (size_t)(I / 4) * 2;
    const int slots = n_used + (shared_e >= 0);
    for (int j = wib; j < n_used; j += MD_WARPS) {
        const int e = s_ids[j];
        const bool valid = e >= 0 && e < n_experts;
        if (!valid) {
            for (int tt = 0; tt < TPW; tt++)
                slot_part_put(part[tt], j, make_float2(0.f, 0.f), false, 0.0f, nullptr, n0 + 8 * tt, D, lane);
            continue;
        }
        const cuda_wdev w = table[2 * n_experts + e];
        __syncwarp();
        xfrag_stage_around<6>(mine, act + ((size_t)t * slots + j) * (size_t)I, (int)I, lane, 32,
                              [&] { rows8_stream_prefetch<UD, TPW>(w, n0 + g, D, I, 0, GI, pre); });
        __syncwarp();
        if (j == 0)
            KT_MARK(2);
        float2 r[TPW];
        if constexpr (TPW == 1)
            r[0] = rows8_dot_range<UD>(w, n0 + g, n0 + g < D, I, mine, 0, GI, pre);
        else
            rows8_stream_dot<UD, TPW>(w, n0 + g, D, I, mine, 0, GI, pre, r);
#pragma unroll
        for (int tt = 0; tt < TPW; tt++)
            slot_part_put(part[tt], j, r[tt], true, 0x1p62f * w.scale2, w.bias, n0 + 8 * tt, D, lane);
        if (j == 0)
            KT_MARK(3);
    }
    if (shared_e >= 0) { /* this warp's share [g0, g1) of the shared expert's K */
        const cuda_wdev w = table[2 * n_experts + shared_e];
        const int g0 = GI * wib / MD_WARPS, g1 = GI * (wib + 1) / MD_WARPS;
        __syncwarp();
        xfrag_stage_around_span<2>(mine, act + ((size_t)t * slots + n_used) * (size_t)I, 32 * g0, 32 * g1, lane, 32,
                                   [&] { rows8_stream_prefetch<UD, TPW>(w, n0 + g, D, I, g0, g1, pre); });
        __syncwarp();
        float2 r[TPW];
        rows8_stream_dot<UD, TPW>(w, n0 + g, D, I, mine, g0, g1, pre, r);
#pragma unroll
        for (int tt = 0; tt < TPW; tt++)
            slot_part_put(part_sh[tt], wib, r[tt], true, 0x1p62f * w.scale2, wib == 0 ? w.bias : nullptr, n0 + 8 * tt,
                          D, lane);
    }
    pdl_trigger(); /* late: see pdl_trigger() */
    __syncthreads();
    KT_MARK(4);
    if (threadIdx.x < 8 * TPW && n0 + threadIdx.x < D) {
        const int tt = threadIdx.x / 8, r = threadIdx.x % 8;
        float o = slots_combine<8>(s_ids, s_w, order, part[tt], n_used, n_experts, r);
        if (shared_e >= 0) {
            float sh = 0.0f;
            for (int k = 0; k < MD_WARPS; k++)
                sh = __fadd_rn(sh, part_sh[tt][k][r]);
            o = __fadd_rn(o, sh);
        }
        out[(size_t)t * (size_t)D + n0 + threadIdx.x] = o;
    }
    KT_END(decode_mma, 1);
}

/* The down kernel with its weights through shared memory (smem_tpw of cuda_moe_decode_mma; see
 * moe_gate_up_mma_kernel's SM): grid (D / (8 tpw), tokens), a warp per slot as above but over
 * tpw 8-row tiles, so that the whole grid can be resident beside the gate/up kernel (one block an
 * SM for Qwen3-30B-A3B at tpw 2, faster at batch 8 than one tile: H200, docs/lab/journal.md).
 * Before its wait it reads the routing (the routing kernel, two launches back, has finished
 * before gate/up passes its own wait and triggers this one) and puts its first slot's weights
 * in flight; after the wait it triggers its dependent at once. The
 * dynamic shared memory: MD_WARPS slots' act fragments (I x 4 bytes each), then MD_WARPS areas of
 * tpw x I / 128 groups. */
__global__ void __launch_bounds__(MD_THREADS, 3)
    moe_down_smem_kernel(const cuda_wdev *table, int n_experts, int64_t D, int64_t I, const float *act,
                         const int32_t *ids, const float *weights, int n_used, float *out, int tpw)
{
    extern __shared__ uint2 xf[];
    __shared__ int order[MD_MAX_USED], s_ids[MD_MAX_USED];
    __shared__ float part[2][MD_MAX_USED][8], s_w[MD_MAX_USED];
    KT_BEGIN();
    xfrag_zeros_init();
    const int t = blockIdx.y, wib = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, GI = (int)(I / 128);
    const int64_t n0 = (int64_t)blockIdx.x * 8 * tpw;
    uint8_t *area = (uint8_t *)xf + (size_t)MD_WARPS * (size_t)I * 4 + (size_t)wib * tpw * GI * RS8_GROUP_BYTES;
    uint2 *mine = xf + (size_t)wib * (size_t)(I / 2);
    slots_load(ids, weights, t, n_used, s_ids, s_w, order);
    /* slot j's weights, all tiles, into the warp's area: one commit group a tile */
    auto stage = [&](const cuda_wdev &w) {
        for (int tt = 0; tt < tpw; tt++) {
            const int64_t row = n0 + 8 * tt + g;
            rows8_stage_async(w, row, row < D, I, 0, GI, area + (size_t)tt * GI * RS8_GROUP_BYTES, GI);
        }
    };
    cuda_wdev w = {};
    int e = wib < n_used ? s_ids[wib] : -1;
    if (e >= 0 && e < n_experts) {
        w = table[2 * n_experts + e];
        stage(w);
    }
    pdl_wait();
    pdl_trigger(); /* one wave beside gate/up's: the next kernel may take the room it leaves */
    KT_MARK(1);
    for (int j = wib; j < n_used; j += MD_WARPS) {
        e = s_ids[j];
        const bool valid = e >= 0 && e < n_experts;
        float2 r[2] = {make_float2(0.f, 0.f), make_float2(0.f, 0.f)};
        if (valid) {
            if (j != wib) {
                w = table[2 * n_experts + e];
                __syncwarp(); /* the previous slot's reads of the area are done */
                stage(w);
            }
            __syncwarp();
            xfrag_stage(mine, act + ((size_t)t * n_used + j) * (size_t)I, (int)I, lane, 32);
            __syncwarp();
            if (j == 0)
                KT_MARK(2);
            for (int tt = 0; tt < tpw; tt++) /* tile tt's group is the (tpw - 1 - tt)-th from the end */
                r[tt] = rows8_dot_smem(area + (size_t)tt * GI * RS8_GROUP_BYTES, mine, 0, GI, GI, tpw - tt);
            if (j == 0)
                KT_MARK(3);
        }
        for (int tt = 0; tt < tpw; tt++)
            slot_part_put(part[tt], j, r[tt], valid, 0x1p62f * w.scale2, w.bias, n0 + 8 * tt, D, lane);
    }
    __syncthreads();
    KT_MARK(4);
    if ((int)threadIdx.x < 8 * tpw && n0 + threadIdx.x < D) {
        const int tt = threadIdx.x / 8, rr = threadIdx.x % 8;
        const float o = slots_combine<8>(s_ids, s_w, order, part[tt], n_used, n_experts, rr);
        out[(size_t)t * (size_t)D + n0 + threadIdx.x] = o;
    }
    KT_END(decode_mma, 1);
}

/* y_j = x W_j^T for up to 3 NVFP4 weights sharing x (1-8 tokens); a row tile is 8 rows of one
 * weight, a block 8 warps = MD_WARPS / ks row tiles x ks slices of K (summed in a fixed order
 * through shared memory). */
/* GM_U: weight groups a warp loads before the wait (and keeps in flight after it). 8 covers a
 * whole q/k/v row slice of Qwen3-30B-A3B (K 2048 in 2 slices: 8 groups of 128), so its dot
 * waits on no load after the wait; with 4 that dot takes 4598 cycles against o's 2140, whose 4
 * groups are all in (H200 kernel trace). */
enum { GM_U = 8 };
/* GM_MAX_CHAIN: the most 128-k groups one warp of gemv_mma walks (its loads are a chain of GM_U at a
 * time: a long one leaves the SM waiting on DRAM latency, not bandwidth) */
enum { GM_MAX_CHAIN = 32 };

struct gemv_mma_params {
    cuda_wdev w[MD_MAX_JOBS];
    int64_t N[MD_MAX_JOBS];
    float *y[MD_MAX_JOBS];
    int64_t first_tile[MD_MAX_JOBS + 1]; /* tile offsets of the jobs; [n_jobs] = all tiles */
    int n_jobs, ks;
    int64_t K;
    const float *x;
    int T; /* tokens (rows of x and of each y), 1..GM_MAX_TOKENS */
};

__global__ void __launch_bounds__(MD_THREADS, 2) gemv_mma_kernel(const __grid_constant__ gemv_mma_params p)
{
    extern __shared__ uint2 xf[];
    __shared__ float part[MD_WARPS][GM_MAX_TOKENS][8];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, T = p.T;
    const int tiles_per_block = MD_WARPS / p.ks, s = warp % p.ks;
    const int64_t tile = (int64_t)blockIdx.x * tiles_per_block + warp / p.ks;
    const bool live = tile < p.first_tile[p.n_jobs];
    int j = 0;
    while (j + 1 < p.n_jobs && tile >= p.first_tile[j + 1])
        j++;
    const int64_t n0 = (tile - p.first_tile[j]) * 8, row = n0 + g;
    const int groups = (int)(p.K / 128), g0 = groups * s / p.ks, g1 = groups * (s + 1) / p.ks;
    const cuda_wdev w = p.w[j];
    KT_BEGIN();
    chunk16 pre[GM_U];
    rows8_prefetch<GM_U>(w, row, live && row < p.N[j], p.K, g0, g1, pre);
    xfrag_zeros_init();
    KT_MARK(1); /* phases: 0 weight issue, 1 PDL wait, 2 x staging, 3 the dot, 4 K slices + store */
    pdl_wait();
    KT_MARK(2);
    for (int tok = 0; tok < T; tok++) /* token tok's fragments at K / 2 uint2 each */
        xfrag_stage(xf + (size_t)tok * (size_t)(p.K / 2), p.x + (size_t)tok * (size_t)p.K, (int)p.K, threadIdx.x,
                    MD_THREADS);
    __syncthreads();
    KT_MARK(3);
    float2 r = make_float2(0.f, 0.f);
    if (live)
        r = rows8_dot_range<GM_U>(w, row, row < p.N[j], p.K, xf, g0, g1, pre, T);
    KT_MARK(4);
    pdl_trigger(); /* late: see pdl_trigger() */
    if (g < T)     /* lane (g, t): token g's rows n0 + 2t, n0 + 2t + 1 */
        part[warp][g][2 * (lane % 4)] = r.x, part[warp][g][2 * (lane % 4) + 1] = r.y;
    __syncthreads();
    if (!live || s != 0)
        return;
    for (int idx = lane; idx < 8 * T; idx += 32) { /* (token, row) pairs of the tile */
        const int tok = idx / 8, rr = idx % 8;
        if (n0 + rr >= p.N[j])
            continue;
        float v = part[warp][tok][rr];
        for (int k = 1; k < p.ks; k++)
            v += part[warp + k][tok][rr];
        v = v * (0x1p62f * w.scale2) + (w.bias ? w.bias[n0 + rr] : 0.0f);
        p.y[j][(size_t)tok * (size_t)p.N[j] + n0 + rr] = v;
    }
    if (warp == 0)
        KT_END(decode_mma, 2);
}

} // namespace

extern "C" int cuda_gemv_mma_supported(int n_w, const struct cuda_wdev *w, int64_t K, int n_tokens,
                                       size_t smem_budget)
{
    if (!cuda_gemv_mma_fits(n_w, K, n_tokens, smem_budget))
        return 0;
    for (int j = 0; j < n_w; j++)
        if ((uintptr_t)w[j].data % 16 || (uintptr_t)w[j].scale % 2)
            return 0;
    return 1;
}

extern "C" cudaError_t cuda_gemv_mma(cudaStream_t stream, int n_w, const struct cuda_wdev *w,
                                     const int64_t *N, int64_t K, const float *x, int n_tokens,
                                     float *const *y, int sm_count, int pdl)
{
    if (!cuda_gemv_mma_supported(n_w, w, K, n_tokens, (size_t)-1))
        return cudaErrorInvalidValue;
    gemv_mma_params p = {};
    p.n_jobs = n_w;
    p.K = K;
    p.x = x;
    p.T = n_tokens;
    const int64_t tiles = gemv_jobs_fill(p, n_w, w, N, y, 8);
    if (!tiles)
        return cudaSuccess;
    /* K slices until every SM has a block (q/k/v of Qwen3-30B: 640 tiles -> 2 slices, 160
     * blocks; o: 256 tiles -> 8 slices, 256 blocks) and no warp walks more than GM_MAX_CHAIN
     * groups (GLM-5's o_proj, K = 16384: 4 slices, 384 blocks, where 2 left 72 of 132 SMs one
     * block of 64-group chains), each slice at least one 128-k group */
    p.ks = 1;
    while (p.ks < MD_WARPS && K / 128 >= 2 * p.ks &&
           ((tiles * p.ks + MD_WARPS - 1) / MD_WARPS < sm_count || K / 128 / p.ks > GM_MAX_CHAIN))
        p.ks *= 2;
    const int64_t blocks = (tiles + MD_WARPS / p.ks - 1) / (MD_WARPS / p.ks);
    const size_t smem = (size_t)n_tokens * (size_t)K * 4;
    if (blocks > 0x7fffffff)
        return cudaErrorInvalidValue;
    return launch_pdl_smem(pdl != 0, gemv_mma_kernel, dim3((unsigned)blocks), dim3(MD_THREADS), smem, stream,
                           p);
}

extern "C" int cuda_moe_decode_mma_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                             size_t smem_budget)
{
    return cuda_moe_decode_mma_fits(fmt, d_model, d_expert, n_used, smem_budget);
}

namespace
{

/* The shared-memory form (see moe_gate_up_mma_kernel's SM, moe_down_smem_kernel). */
cudaError_t moe_smem_launch(cudaStream_t stream, const struct cuda_wdev *table, int n_experts, int64_t d_model,
                            int64_t d_expert, const float *x, int n_tokens, const int32_t *ids, const float *weights,
                            int n_used, float *act, float *out, int pdl, int tpw)
{
    /* x's fragments, then each warp's D / 128 groups of its 8 rows */
    const size_t smem1 = cuda_moe_decode_mma_smem_bytes(d_model, d_expert, tpw, 0),
                 smem2 = cuda_moe_decode_mma_smem_bytes(d_model, d_expert, tpw, 1);
    cudaError_t e = cudaSuccess;
    if (smem1 > 48 * 1024)
        e = cudaFuncSetAttribute(moe_gate_up_mma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem1);
    if (e == cudaSuccess && smem2 > 48 * 1024)
        e = cudaFuncSetAttribute(moe_down_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem2);
    /* the whole shared memory for both: an SM changes its L1 / shared split only when idle, so a
     * gate/up kernel that ran with a smaller split would keep the down blocks out */
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(moe_gate_up_mma_kernel<true>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(moe_down_smem_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess)
        return e;
    const int rows_per_block = 4 * MG_WARPS;
    dim3 g1((unsigned)((d_expert + rows_per_block - 1) / rows_per_block), (unsigned)(n_tokens * n_used));
    e = launch_pdl(pdl != 0, moe_gate_up_mma_kernel<true>, g1, dim3(MG_THREADS), smem1, stream, table, n_experts,
                   d_expert, d_model, x, ids, n_used, -1, act);
    if (e != cudaSuccess)
        return e;
    dim3 g2((unsigned)((d_model + 8 * tpw - 1) / (8 * tpw)), (unsigned)n_tokens);
    return launch_pdl(pdl != 0, moe_down_smem_kernel, g2, dim3(MD_THREADS), smem2, stream, table, n_experts, d_model,
                      d_expert, act, ids, weights, n_used, out, tpw);
}

/* The register-form down kernel's 8-row tiles a block: the fewest of 1, 2, 3 whose grid is one
 * resident wave (the occupancy of its shared memory and registers on this device), else the
 * most that fit (4 spill at 128 registers). Sets each form's dynamic shared memory attribute. */
int down_tiles_per_block(int64_t D, int n_tokens, size_t smem, cudaError_t *err)
{
    int dev = 0, sms = 0;
    *err = cudaGetDevice(&dev);
    if (*err == cudaSuccess)
        *err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const int forms[3] = {1, 2, 3};
    int best = 1;
    for (int f = 0; f < 3 && *err == cudaSuccess; f++) {
        const int tpw = forms[f];
        void (*k)(const cuda_wdev *, int, int64_t, int64_t, const float *, const int32_t *, const float *, int, int,
                  float *) = tpw == 3 ? moe_down_mma_kernel<3> : tpw == 2 ? moe_down_mma_kernel<2> : moe_down_mma_kernel<1>;
        if (smem > 48 * 1024 &&
            (*err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess) {
            if (tpw == 1)
                return 1;
            (void)cudaGetLastError(); /* its larger static partials do not fit beside the activations */
            *err = cudaSuccess;
            return best;
        }
        int per_sm = 0;
        if ((*err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, MD_THREADS, smem)) != cudaSuccess)
            return 1;
        if (per_sm == 0)
            return best;
        best = tpw;
        const int64_t blocks = (D + 8 * tpw - 1) / (8 * tpw) * (int64_t)n_tokens;
        if (blocks <= (int64_t)per_sm * sms)
            return tpw;
    }
    return best;
}

/* The register form (moe_gate_up_mma_kernel<false>, moe_down_mma_kernel); shared_e >= 0: each
 * token's shared expert as one more slot. */
cudaError_t moe_mma_launch(cudaStream_t stream, const struct cuda_wdev *table, int n_experts, int64_t d_model,
                           int64_t d_expert, const float *x, int n_tokens, const int32_t *ids, const float *weights,
                           int n_used, int shared_e, float *act, float *out, int pdl)
{
    /* x fragments: 2 uint2 (hi, lo) per 4 floats = as many bytes as the floats */
    const size_t smem1 = (size_t)d_model * 4, smem2 = (size_t)MD_WARPS * (size_t)d_expert * 4;
    cudaError_t e = cudaSuccess;
    if (smem1 > 48 * 1024)
        e = cudaFuncSetAttribute(moe_gate_up_mma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem1);
    if (e != cudaSuccess)
        return e;
    void (*down)(const cuda_wdev *, int, int64_t, int64_t, const float *, const int32_t *, const float *, int, int,
                 float *) = nullptr;
    const int tpw = down_tiles_per_block(d_model, n_tokens, smem2, &e);
    if (e != cudaSuccess)
        return e;
    down = tpw == 3 ? moe_down_mma_kernel<3> : tpw == 2 ? moe_down_mma_kernel<2> : moe_down_mma_kernel<1>;
    const int rows_per_block = 4 * MG_WARPS, slots = n_used + (shared_e >= 0);
    dim3 g1((unsigned)((d_expert + rows_per_block - 1) / rows_per_block), (unsigned)(n_tokens * slots));
    e = launch_pdl(pdl != 0, moe_gate_up_mma_kernel<false>, g1, dim3(MG_THREADS), smem1, stream, table, n_experts,
                   d_expert, d_model, x, ids, n_used, shared_e, act);
    if (e != cudaSuccess)
        return e;
    dim3 g2((unsigned)((d_model + 8 * tpw - 1) / (8 * tpw)), (unsigned)n_tokens);
    return launch_pdl(pdl != 0, down, g2, dim3(MD_THREADS), smem2, stream, table, n_experts, d_model, d_expert, act,
                      ids, weights, n_used, shared_e, out);
}

} // namespace

extern "C" cudaError_t cuda_moe_decode_mma(cudaStream_t stream, const struct cuda_wdev *table, int n_experts,
                                           int64_t d_model, int64_t d_expert, const float *x, int n_tokens,
                                           const int32_t *ids, const float *weights, int n_used, float *act,
                                           float *out, int pdl, int smem_tpw, int shared_e)
{
    if (n_tokens <= 0)
        return cudaSuccess;
    if (d_model % 128 || d_expert % 128 || n_used < 1 || n_used > MD_MAX_USED ||
        (int64_t)n_tokens * (n_used + 1) > 65535 || shared_e >= n_experts || (shared_e >= 0 && smem_tpw))
        return cudaErrorInvalidValue;
    if (smem_tpw) {
        if (!cuda_moe_decode_mma_smem_fits(d_model, d_expert, n_used, smem_tpw, (size_t)-1))
            return cudaErrorInvalidValue;
        return moe_smem_launch(stream, table, n_experts, d_model, d_expert, x, n_tokens, ids, weights, n_used, act,
                               out, pdl, smem_tpw);
    }
    return moe_mma_launch(stream, table, n_experts, d_model, d_expert, x, n_tokens, ids, weights, n_used,
                          shared_e < 0 ? -1 : shared_e, act, out, pdl);
}
