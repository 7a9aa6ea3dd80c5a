/* cuda_moe_chain.cu — the routed-MoE half of a one-token layer (norm, router, routing, gate/up,
 * down, the residual add) in ONE kernel of one block an SM, its three phases chained by arrival
 * counters instead of kernel boundaries, and the experts' weights copied into shared memory by
 * every SM as soon as the routing is known (the backend takes it with MOESERVE_MOE_CHAIN=1).
 *
 * Why: at batch 1 the composed path runs five kernels for this half (add + norm, router GEMV,
 * route, gate/up, down: 2.2 + 1.8 + 3.3 + 12.7 + 8.8 us a layer of Qwen3-30B-A3B on the H200 in
 * session 7's trace), and gate/up and down read their 21 MB of expert weights at ~1 TB/s.
 * tools/bench_layer_chain.cu (session 12) measured, on the same shapes, a counter link at 0.9 us
 * and the experts' bytes, copied with cp.async by all 132 SMs right after the routing, at
 * ~3.7 TB/s. Phases (grid = the SMs, every block resident; nb blocks):
 *   P0 every block: h (+ the pending delta, through L2) -> x = rmsnorm(h) * norm_w in shared
 *      memory, rounded as cuda_norm.cu does; router rows e = b, b + nb, ...: the block's warps split the row, their
 *      sums added in order; arrive. Then x into the dec16 B fragments while the others finish.
 *   P1 after every block's arrival: every block routes the token itself (route_rank_block: the
 *      same ids and weights in every block); two producer warps copy its gate/up tile pairs and
 *      then its down tiles (cp.async, each set completing an mbarrier as it lands) while the six
 *      other warps write act = silu(gate) * up for each pair as it lands (rounded as
 *      cuda_silu_mul): the copies are bound by the memory system (~165 KB an SM at Qwen3's
 *      widths), and warps that issue them stall, so the dots run on warps that do not; arrive.
 *   P2 after every block's arrival: act (through L2) into B fragments, the down tiles (landed
 *      meanwhile) against them, each 16-row tile's slots combined in ascending expert id
 *      (slots_combine, as the CPU adds them), h = (h + delta) + that. The last block out zeroes the counters.
 * Units: a gate/up pair is 16 rows of gate and of up of one slot's expert (k x I / 16 of them,
 * block b takes b, b + nb, ...); a down unit is 16 rows of D for all k slots (D / 16).
 * The weights are the dec16 copies (cuda_dec16.cuh: a 16-row tile's 64-k segment is 512 bytes of
 * data and 64 of scales; in shared memory a tile is its data then its scales).
 * All blocks must be resident, or a phase waits forever: the grid is the SM count at one block
 * an SM (checked against the occupancy), and the kernel lets the next one start (PDL) only once
 * every block has arrived at P0's counter, so no later kernel can hold an SM one of these blocks
 * still needs. A wait that
 * outlasts 10 s traps (a launch error the backend reports) rather than hang.
 * Numbers: the router's and the tiles' fp32 sums are added in an order of their own (the same on
 * every run); the routing, SiLU and combine round as the per-op kernels do.
 */
#include <math.h>
#include <stdio.h>

#include "backend/cuda/cuda_dec16.cuh"
#include "backend/cuda/cuda_route_warp.cuh"

namespace
{

enum {
    CH_THREADS = DQ_THREADS, /* dec16_stage_x's stride */
    CH_WARPS = CH_THREADS / 32,
    CH_MAX_K = 16,       /* slots: a down unit's k tiles fit the partial buffer */
    CH_RP = 4,           /* a thread's router pieces loaded before the wait: D <= 8192 */
    CH_NW = 32,          /* a thread's norm weights loaded before the wait: D <= 8192 */
    CH_PRODUCERS = 2,    /* warps issuing P1's copies while the others compute (warps 6, 7) */
    CH_CONSUMERS = CH_WARPS - CH_PRODUCERS,
    CH_MAX_PAIRS = 8,    /* gate/up pairs a block (one mbarrier each) */
    CH_COUNTERS = 32,    /* words: P0, P1, done (one 128-byte line) */
    CH_TRACE = 16,       /* marks a launch (MOESERVE_MOE_CHAIN_TRACE=1) */
    CH_TRACE_LAUNCHES = 16384,
    CH_TRACE_BLOCKS = 1024 /* per-block launch counters before the marks */
};

/* bytes of a 16-row dec16 tile of K columns in shared memory: K / 64 segments of 512 data bytes,
 * then their 64 scale bytes each */
__host__ __device__ constexpr size_t ch_tile_bytes(int K)
{
    return (size_t)(K / 64) * 576;
}

struct chain_params {
    int D, I, E, k, nb;
    float eps;
    float *h;
    const float *delta;
    const float *norm_w;
    const uint16_t *router;
    const float *router_bias;
    route_warp_args ra;
    const cuda_wdev *gate, *up, *down;
    float *logits, *act, *weights;
    int32_t *ids;
    unsigned *count;
    unsigned long long *trace; /* NULL, or CH_TRACE_BLOCKS counters then CH_TRACE marks a launch */
    size_t a_bytes, b_bytes; /* shared memory regions A (gate/up tiles; act staged), B (down tiles) */
};

__device__ __forceinline__ unsigned ch_load_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* every thread of the block after `want` blocks have arrived at *c */
__device__ __forceinline__ void ch_wait(const unsigned *c, unsigned want)
{
    if (threadIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        while (ch_load_acquire(c) < want) {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (t - t0 > 10000000000ull) {
                printf("cuda_moe_chain: block %d waited 10 s for %u arrivals (has %u): not all blocks "
                       "resident\n",
                       blockIdx.x, want, ch_load_acquire(c));
                __trap();
            }
        }
    }
    __syncthreads();
}

/* Trace builds of a launch (p.trace set): block 0 notes the time at marks 0..13, every block
 * its P0 and P1 arrivals into marks 14 and 15 (atomicMax: the last one stays). */
struct ch_tracer {
    unsigned long long *m = nullptr;
    __device__ void start(const chain_params &p)
    {
        if (!p.trace)
            return;
        __shared__ unsigned long long s_slot;
        if (threadIdx.x == 0)
            s_slot = atomicAdd(p.trace + blockIdx.x, 1ull);
        __syncthreads();
        if (s_slot < CH_TRACE_LAUNCHES)
            m = p.trace + CH_TRACE_BLOCKS + (size_t)s_slot * CH_TRACE;
    }
    __device__ static unsigned long long now()
    {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        return t;
    }
    __device__ void mark(int i) const
    {
        if (m && blockIdx.x == 0 && threadIdx.x == 0)
            m[i] = now();
    }
    __device__ void last(int i) const
    {
        if (m && threadIdx.x == 0)
            atomicMax(m + i, now());
    }
};

/* this block's global writes are done: count it in */
__device__ __forceinline__ void ch_arrive(unsigned *c)
{
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        atomicAdd(c, 1u);
}

/* bytes [0, n) from global src to shared dst by threads tid = 0 .. nt-1 (cp.async, 16 bytes
 * each; n % 16 == 0, both 16-byte aligned) */
__device__ __forceinline__ void ch_copy(uint8_t *dst, const void *src, size_t n, int tid, int nt)
{
    const uint8_t *s = (const uint8_t *)src;
    for (size_t i = (size_t)tid * 16; i < n; i += (size_t)nt * 16)
        cp_async16(dst + i, s + i);
}

/* tile r (16 rows) of a dec16 weight with K columns into shared memory at dst */
__device__ __forceinline__ void ch_copy_tile(uint8_t *dst, const cuda_wdev &w, int r, int K, int tid, int nt)
{
    const size_t nseg = (size_t)(K / 64);
    ch_copy(dst, (const uint8_t *)w.data + (size_t)r * nseg * 512, nseg * 512, tid, nt);
    ch_copy(dst + nseg * 512, (const uint8_t *)w.scale + (size_t)r * nseg * 64, nseg * 64, tid, nt);
}

/* mbarriers (sm_80+): the copies of a pair complete one when every producer thread's earlier
 * cp.async has landed (cp.async.mbarrier.arrive.noinc: one arrival a producer thread, counted in
 * the init); the consumer warps wait for its phase 0 (one use a launch, initialised each launch) */
__device__ __forceinline__ void ch_mbar_init(uint64_t *m, unsigned count)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(m);
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}

__device__ __forceinline__ void ch_mbar_arrive_copies(uint64_t *m)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(m);
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(a) : "memory");
}

__device__ __forceinline__ void ch_mbar_wait(uint64_t *m)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(m);
    unsigned done = 0;
    do
        asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(a)
                     : "memory");
    while (!done);
}

/* barrier `id` of the first nt threads (0 with every thread: __syncthreads) */
__device__ __forceinline__ void ch_bar(int id, int nt)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nt) : "memory");
}

/* out[i * 16 + r] = the raw sum of row r of tile i (n <= CH_MAX_K tiles of K columns at w) against
 * the B fragments at xb (per_tile: tile i against xb + i * K), by the first nw warps (barrier
 * `bar` among them). A tile's segments are split over nw / n warps (one warp a tile from n >=
 * nw), each warp keeping two chains of segments, the sums added in order. Every one of those
 * threads calls it; out is readable after it returns. */
__device__ void ch_tiles(const uint8_t *w, int n, int K, const uint2 *xb, bool per_tile, float *part, float *out,
                         int nw, int bar)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int nseg = K / 64, wpt = n >= nw ? 1 : nw / n, span = nw / wpt;
    if (warp < span * wpt)
        for (int i = warp / wpt; i < n; i += span) {
            const int sub = warp % wpt;
            const uint8_t *tw = w + (size_t)i * ch_tile_bytes(K);
            const uint4 *wd = (const uint4 *)tw;
            const uint2 *ws = (const uint2 *)(tw + (size_t)nseg * 512);
            const uint2 *xl = (per_tile ? xb + (size_t)i * K : xb) + (g == 0 ? t : g == 1 ? 4 + t : 8 + t);
            float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc2[4] = {0.f, 0.f, 0.f, 0.f};
            int s = sub;
            for (; s + wpt < nseg; s += 2 * wpt) { /* two independent chains: more in flight a warp */
                dec16_segment(wd[(size_t)s * 32 + lane], ws[(size_t)s * 8 + g], xl + (size_t)s * 64, acc);
                dec16_segment(wd[(size_t)(s + wpt) * 32 + lane], ws[(size_t)(s + wpt) * 8 + g],
                              xl + (size_t)(s + wpt) * 64, acc2);
            }
            if (s < nseg)
                dec16_segment(wd[(size_t)s * 32 + lane], ws[(size_t)s * 8 + g], xl + (size_t)s * 64, acc);
            if (t == 0) {
                part[(i * wpt + sub) * 16 + g] = (acc[0] + acc[1]) + (acc2[0] + acc2[1]);
                part[(i * wpt + sub) * 16 + g + 8] = (acc[2] + acc[3]) + (acc2[2] + acc2[3]);
            }
        }
    ch_bar(bar, nw * 32);
    for (int j = threadIdx.x; j < n * 16; j += nw * 32) {
        float s = 0.f;
        for (int sub = 0; sub < wpt; sub++)
            s += part[((j / 16) * wpt + sub) * 16 + j % 16];
        out[j] = s;
    }
    ch_bar(bar, nw * 32);
}

/* a dec16 tile sum's scale: x was staged times 2^100 and the weights are E2M1 x 2^-126 */
__device__ __forceinline__ float ch_scale(const cuda_wdev &w)
{
    return 0x1p26f * w.scale2;
}

template <int EP>
__global__ void __launch_bounds__(CH_THREADS, 1) moe_chain_kernel(const __grid_constant__ chain_params p)
{
    extern __shared__ __align__(16) uint8_t ch_raw[];
    __shared__ float s_lg[EP], s_w[CH_MAX_K], s_red[CH_WARPS], outs[CH_MAX_K * 16], part[CH_MAX_K * 16];
    __shared__ int32_t s_ids[CH_MAX_K];
    __shared__ int s_order[CH_MAX_K];
    __shared__ uint64_t s_mbar[CH_MAX_PAIRS + 1]; /* the pairs' copies, then down's */
    uint8_t *A = ch_raw, *B = ch_raw + p.a_bytes;
    uint2 *xb = (uint2 *)(B + p.b_bytes);
    float *xs = (float *)(xb + p.D); /* past x's fragments (D uint2) */
    const int b = blockIdx.x, nb = p.nb, D = p.D, I = p.I, k = p.k, warp = threadIdx.x / 32,
              lane = threadIdx.x % 32;
    const int gu_units = k * (I / 16), dn_units = D / 16;

    ch_tracer tr;
    tr.start(p);
    tr.mark(0);
    if (threadIdx.x <= CH_MAX_PAIRS) /* visible to the producers after the barriers of P0 */
        ch_mbar_init(&s_mbar[threadIdx.x], CH_PRODUCERS * 32);
    /* P0: the norm weights and the router pieces of this block's first row before the wait
     * (weights never change) */
    float nw[CH_NW];
#pragma unroll
    for (int q = 0; q < CH_NW; q++)
        if ((int)threadIdx.x + q * CH_THREADS < D)
            nw[q] = __ldg(p.norm_w + threadIdx.x + q * CH_THREADS);
    uint4 rw[CH_RP];
    const uint4 *row0 = (const uint4 *)(p.router + (size_t)b * D);
#pragma unroll
    for (int q = 0; q < CH_RP; q++)
        if (b < p.E && (int)threadIdx.x + q * CH_THREADS < D / 8)
            rw[q] = __ldg(row0 + threadIdx.x + q * CH_THREADS);
    pdl_wait();
    tr.mark(1);
    { /* xs = rmsnorm(h + delta) * norm_w, as block_rmsnorm (the weights already in registers) */
        stage_cg(xs, p.h, D, threadIdx.x, CH_THREADS, p.delta);
        __syncthreads();
        double ss = 0;
        for (int i = threadIdx.x; i < D; i += CH_THREADS)
            ss += (double)xs[i] * xs[i];
        const float inv = dev_rms_inv(block_sum_double(ss), D, p.eps);
#pragma unroll
        for (int q = 0; q < CH_NW; q++) {
            const int i = (int)threadIdx.x + q * CH_THREADS;
            if (i < D)
                xs[i] = __fmul_rn(nw[q], __fmul_rn(xs[i], inv));
        }
        __syncthreads();
    }
    tr.mark(2);
    for (int e = b; e < p.E; e += nb) {
        const uint4 *row = (const uint4 *)(p.router + (size_t)e * D);
        float acc = 0.0f;
#pragma unroll
        for (int q = 0; q < CH_RP; q++) {
            const int c = (int)threadIdx.x + q * CH_THREADS;
            if (c >= D / 8)
                break;
            const uint4 v = e == b ? rw[q] : __ldg(row + c);
            const uint32_t ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc = fmaf(__uint_as_float(ws[i] << 16), xs[8 * c + 2 * i], acc);
                acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), xs[8 * c + 2 * i + 1], acc);
            }
        }
        acc = warp_sum(acc);
        if (lane == 0)
            s_red[warp] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            float s = 0.0f;
            for (int w = 0; w < CH_WARPS; w++)
                s += s_red[w];
            p.logits[e] = s + (p.router_bias ? p.router_bias[e] : 0.0f);
        }
        __syncthreads();
    }
    tr.last(14);
    ch_arrive(p.count + 0);
    tr.mark(3);
    dec16_stage_x(xb, xs, D, [] {}); /* x's B fragments while the other blocks finish */
    tr.mark(4);

    /* P1: route, copy this block's expert tiles, gate/up as they land */
    ch_wait(p.count + 0, (unsigned)nb);
    tr.mark(5);
    for (int e = threadIdx.x; e < p.E; e += CH_THREADS)
        s_lg[e] = __ldcg(p.logits + e);
    __syncthreads();
    route_rank_block<EP, route_no_mark, CH_THREADS>(s_lg, p.ra, s_ids, s_w);
    __syncthreads();
    if (threadIdx.x == 0)
        slots_by_expert(s_ids, k, s_order);
    if (b == 0 && (int)threadIdx.x < k)
        p.ids[threadIdx.x] = s_ids[threadIdx.x], p.weights[threadIdx.x] = s_w[threadIdx.x];
    tr.mark(6);
    pdl_trigger(); /* every block has arrived once, so all are resident: see the top */
    int np = 0;
    for (int pr = b; pr < gu_units; pr += nb)
        np++;
    if (warp >= CH_CONSUMERS) {
        /* producers: each pair's gate and up tiles, then the down tiles of this block's units,
         * each set completing its mbarrier as it lands */
        const int pt = (int)threadIdx.x - CH_CONSUMERS * 32, pn = CH_PRODUCERS * 32;
        for (int i = 0; i < np; i++) {
            const int pr = b + i * nb, e = s_ids[pr / (I / 16)], r = pr % (I / 16);
            if (e >= 0 && e < p.E) {
                ch_copy_tile(A + (size_t)(2 * i) * ch_tile_bytes(D), p.gate[e], r, D, pt, pn);
                ch_copy_tile(A + (size_t)(2 * i + 1) * ch_tile_bytes(D), p.up[e], r, D, pt, pn);
            }
            ch_mbar_arrive_copies(&s_mbar[i]);
        }
        for (int u = b, d = 0; u < dn_units; u += nb, d++)
            for (int j = 0; j < k; j++) {
                const int e = s_ids[j];
                if (e >= 0 && e < p.E)
                    ch_copy_tile(B + (size_t)(d * k + j) * ch_tile_bytes(I), p.down[e], u, I, pt, pn);
            }
        ch_mbar_arrive_copies(&s_mbar[CH_MAX_PAIRS]);
    } else {
        /* consumers: act = silu(gate) * up for each pair as it lands */
        tr.mark(7);
        for (int i = 0; i < np; i++) {
            ch_mbar_wait(&s_mbar[i]);
            if (i == 0)
                tr.mark(8);
            ch_tiles(A + (size_t)(2 * i) * ch_tile_bytes(D), 2, D, xb, false, part, outs, CH_CONSUMERS, 1);
            const int pr = b + i * nb, slot = pr / (I / 16), n = (pr % (I / 16)) * 16 + (int)threadIdx.x;
            if (threadIdx.x < 16) {
                const int e = s_ids[slot];
                float v = 0.0f; /* no expert: contributes nothing (down skips the slot too) */
                if (e >= 0 && e < p.E) {
                    const cuda_wdev wg = p.gate[e], wu = p.up[e];
                    float gv = outs[threadIdx.x] * ch_scale(wg), uv = outs[16 + threadIdx.x] * ch_scale(wu);
                    if (wg.bias)
                        gv += wg.bias[n];
                    if (wu.bias)
                        uv += wu.bias[n];
                    v = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), uv); /* as cuda_silu_mul */
                }
                p.act[(size_t)slot * I + n] = v;
            }
        }
    }
    tr.last(15);
    ch_arrive(p.count + 1);
    tr.mark(9);

    /* P2: down for this block's 16-row units, the slots combined, h += */
    ch_wait(p.count + 1, (unsigned)nb);
    tr.mark(10);
    const int nd = (dn_units - b + nb - 1) / nb; /* this block's down units (<= 0: none) */
    if (nd > 0) {
        float *stage = (float *)A; /* A is free: this block's gate/up tiles are done */
        stage_cg(stage, p.act, k * I, threadIdx.x, CH_THREADS);
        __syncthreads();
        for (int q = threadIdx.x; q < k * I / 4; q += CH_THREADS) {
            const int j = q / (I / 4), i = q % (I / 4);
            dec16_put_x(xb + (size_t)j * I, i, *(const float4 *)(stage + (size_t)j * I + 4 * i));
        }
        tr.mark(11);
        ch_mbar_wait(&s_mbar[CH_MAX_PAIRS]); /* down's copies (issued in P1) */
        __syncthreads();
        tr.mark(12);
        for (int d = 0; d < nd; d++) {
            const int u = b + d * nb;
            ch_tiles(B + (size_t)(d * k) * ch_tile_bytes(I), k, I, xb, true, part, outs, CH_WARPS, 0);
            if ((int)threadIdx.x < k * 16) {
                const int j = threadIdx.x / 16, r = u * 16 + threadIdx.x % 16, e = s_ids[j];
                float v = 0.0f;
                if (e >= 0 && e < p.E) {
                    const cuda_wdev wd = p.down[e];
                    v = outs[threadIdx.x] * ch_scale(wd) + (wd.bias ? wd.bias[r] : 0.0f);
                }
                outs[threadIdx.x] = v;
            }
            __syncthreads();
            if (threadIdx.x < 16) {
                const int r = u * 16 + threadIdx.x;
                const float o = slots_combine<16>(s_ids, s_w, s_order, (const float(*)[16])outs, k, p.E,
                                                  threadIdx.x);
                const float hr = p.delta ? __fadd_rn(__ldcg(p.h + r), __ldcg(p.delta + r)) : __ldcg(p.h + r);
                p.h[r] = __fadd_rn(hr, o); /* (h + delta) + moe, as the add ops round it */
            }
            __syncthreads();
        }
    }
    tr.mark(13);
    /* the last block out zeroes the counters for the next launch (every block is past its waits) */
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(p.count + 2, 1u) == (unsigned)nb - 1) {
        atomicExch(p.count + 0, 0u);
        atomicExch(p.count + 1, 0u);
        atomicExch(p.count + 2, 0u);
    }
}

/* region A: the block's gate/up pairs (2 tiles of K = D each), at least k x I floats (act is
 * staged there in P2); B: its down units (k tiles of K = I each); then x's fragments (max(D, k x
 * I) uint2) with x's floats (D) past the first D */
struct ch_layout {
    size_t a, b, x;
};

ch_layout ch_layout_of(int D, int I, int k, int blocks)
{
    const int gu_units = k * (I / 16), dn_units = D / 16;
    const size_t ppb = (size_t)((gu_units + blocks - 1) / blocks), dpb = (size_t)((dn_units + blocks - 1) / blocks);
    ch_layout l;
    l.a = ppb * 2 * ch_tile_bytes(D);
    if (l.a < (size_t)k * I * 4)
        l.a = (size_t)k * I * 4;
    l.b = dpb * (size_t)k * ch_tile_bytes(I);
    const size_t xf = (size_t)(D > k * I ? D : k * I) * 8, xd = (size_t)D * 8 + (size_t)D * 4;
    l.x = xf > xd ? xf : xd;
    return l;
}

template <int EP> cudaError_t ch_launch(cudaStream_t stream, const chain_params &p, size_t smem, int pdl)
{
    return launch_pdl_smem(pdl != 0, moe_chain_kernel<EP>, dim3((unsigned)p.nb), dim3(CH_THREADS), smem, stream,
                           p);
}

template <int EP> int ch_fits(size_t smem, size_t budget)
{
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, moe_chain_kernel<EP>) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return smem + fa.sharedSizeBytes <= budget;
}

} // namespace

extern "C" size_t cuda_moe_chain_counter_words(void)
{
    return CH_COUNTERS;
}

extern "C" size_t cuda_moe_chain_smem_bytes(int D, int I, int n_used, int blocks)
{
    if (D <= 0 || I <= 0 || D % 64 || I % 64 || n_used < 1 || blocks < 1)
        return 0;
    const ch_layout l = ch_layout_of(D, I, n_used, blocks);
    return l.a + l.b + l.x;
}

extern "C" int cuda_moe_chain_supported(const struct cuda_moe_chain_args *a, int sm_count, size_t smem_budget)
{
    const struct route_args *r = a->route;
    if (a->D <= 0 || a->I <= 0 || a->D % 64 || a->I % 64 || a->D > 8 * CH_RP * CH_THREADS || a->E < 1 ||
        a->E > 256 || a->n_used < 1 || a->n_used > CH_MAX_K || a->n_used > a->E || sm_count < 1 || !r ||
        !cuda_route_warp_supported(r) || r->n_experts != a->E || r->n_used != a->n_used ||
        (size_t)a->n_used * a->I > (size_t)INT32_MAX / 8)
        return 0;
    const int64_t pairs = (int64_t)a->n_used * (a->I / 16);
    if ((pairs + sm_count - 1) / sm_count > CH_MAX_PAIRS)
        return 0;
    const size_t smem = cuda_moe_chain_smem_bytes(a->D, a->I, a->n_used, sm_count);
    return smem && (a->E <= 128 ? ch_fits<128>(smem, smem_budget) : ch_fits<256>(smem, smem_budget));
}

extern "C" cudaError_t cuda_moe_chain(cudaStream_t stream, const struct cuda_moe_chain_args *a, int sm_count,
                                      size_t smem_budget, int pdl)
{
    if (!cuda_moe_chain_supported(a, sm_count, smem_budget) || (a->trace && sm_count > CH_TRACE_BLOCKS))
        return cudaErrorInvalidValue;
    const ch_layout l = ch_layout_of(a->D, a->I, a->n_used, sm_count);
    const size_t smem = l.a + l.b + l.x;
    /* one block an SM, every block resident: the occupancy must allow the whole grid at once */
    int occ = 0;
    cudaError_t e = a->E <= 128 ? cudaFuncSetAttribute(moe_chain_kernel<128>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                                : cudaFuncSetAttribute(moe_chain_kernel<256>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    e = a->E <= 128 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_chain_kernel<128>, CH_THREADS, smem)
                    : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_chain_kernel<256>, CH_THREADS, smem);
    if (e != cudaSuccess)
        return e;
    if (occ < 1)
        return cudaErrorInvalidConfiguration;
    chain_params p = {};
    p.D = a->D, p.I = a->I, p.E = a->E, p.k = a->n_used, p.nb = sm_count;
    p.eps = a->eps;
    p.h = a->h, p.delta = a->delta, p.norm_w = a->norm_w;
    p.router = (const uint16_t *)a->router, p.router_bias = a->router_bias;
    p.ra = route_warp_args_from(a->route);
    p.gate = a->gate, p.up = a->up, p.down = a->down;
    p.logits = a->logits, p.act = a->act, p.ids = a->ids, p.weights = a->weights;
    p.count = a->count;
    p.trace = a->trace;
    p.a_bytes = l.a, p.b_bytes = l.b;
    return a->E <= 128 ? ch_launch<128>(stream, p, smem, pdl) : ch_launch<256>(stream, p, smem, pdl);
}

extern "C" size_t cuda_moe_chain_trace_entries(void)
{
    return CH_TRACE_BLOCKS + (size_t)CH_TRACE_LAUNCHES * CH_TRACE;
}

extern "C" int cuda_moe_chain_trace_summary(const unsigned long long *t, double out[CUDA_MOE_CHAIN_SPANS])
{
    const unsigned long long cap = CH_TRACE_LAUNCHES, n64 = t[0] < cap ? t[0] : cap;
    const int n = (int)n64;
    for (int i = 0; i < CUDA_MOE_CHAIN_SPANS; i++)
        out[i] = 0.0;
    for (int l = 0; l < n; l++) {
        const unsigned long long *m = t + CH_TRACE_BLOCKS + (size_t)l * CH_TRACE;
        for (int i = 0; i < 13; i++)
            out[i] += (double)(long long)(m[i + 1] - m[i]) / 1000.0;
        out[13] += (double)(long long)(m[5] - m[14]) / 1000.0; /* last P0 arrival -> block 0 on */
        out[14] += (double)(long long)(m[10] - m[15]) / 1000.0;
        out[15] += (double)(long long)(m[13] - m[0]) / 1000.0;
    }
    for (int i = 0; i < CUDA_MOE_CHAIN_SPANS && n > 0; i++)
        out[i] /= n;
    return n;
}
