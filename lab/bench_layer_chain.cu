/* bench_layer_chain.cu — what a batch-1 decode layer of Qwen3-30B-A3B could cost as ONE persistent
 * kernel whose weight streams run ahead of the dependency chain. A feasibility measurement for
 * NOTES.md "Next steps 1" (the 50% target needs ~18-21 us a layer; the per-op kernels take ~50).
 *
 * Session 5's one-kernel layer (cuda_layer_decode.cu) took 104 us a layer: grid barriers between
 * 7 phases, each phase loading its weights only after its barrier. Here every block copies the
 * weights of its next dense phase into shared memory (cp.async) while the chain still runs
 * elsewhere, and the expert weights as soon as the routing is known:
 *   P0 q/k/v   (5120 x 2048)  tiles already in buffer A (copied during the previous layer)
 *   P1 attention (32 heads, 4 KV heads, 256 cached keys, fp32): 32 blocks
 *   P2 o       (2048 x 4096)  tiles already in buffer B
 *   P3 router  (128 x 2048 fp32 logits): 128 blocks
 *   P4 top-8 (every block, from the 128 logits), then its gate/up tiles of the chosen experts into
 *      A and its down tiles into B, SiLU(gate) * up as the gate/up tiles land
 *   P5 down    (2048 x 768 for each of the 8 experts, combined with the routing weights) + residual
 * A phase waits for its producers with one counter (release add / acquire spin by one thread, a
 * block barrier), not a grid barrier. Dots: the dec16 layout of cuda_dec16.cu (16 rows a tile, the
 * production dec16_segment), so the arithmetic is the real one. 48 layers with their own random
 * weights (1.5 GB, nothing left in L2), as a decode step reads them.
 *
 * Variants (us a layer, the best of 5 runs of 48 layers):
 *   ahead     the design above;
 *   after     the same kernel copying every phase's weights only after its wait (session 5's order);
 *   fixed     ahead with experts 0..7 in every layer, copied right after q/k/v and o: what waiting
 *             for the routing costs (speculative expert copies could win at most that);
 *   hot       ahead on ONE layer's weights 48 times (L2-resident: the chain's own floor);
 * and, for each, block 0's time in each phase (from the end of one wait to the end of the next).
 * The output is not checked against a reference: it is a timing tool on random data; its checksum
 * is printed so that a run that computed nothing shows.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/bench_layer_chain tools/bench_layer_chain.cu &&
 *   /tmp/bench_layer_chain
 *
 * Written in session 11; first run in session 12 (H200, us a layer): ahead 58.3 with a naive
 * attention (25.5 of it); then the attention split by keys (4 blocks a head, merged as o stages x),
 * top-k by ranks, marks inside gate/up and down and the "sync" variant (the counter chain alone):
 * ahead 41.4, after 42.1, fixed 39.9, hot 36.9, sync 5.5 (0.9 a link). NOTES.md has the breakdown.
 */
#include "backend/cuda/cuda_dec16.cu"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench_ck.cuh"

namespace
{

/* Qwen3-30B-A3B at batch 1 */
enum {
    LC_D = 2048,
    LC_QKV = 5120,
    LC_Q = 4096,
    LC_I = 768,
    LC_E = 128,
    LC_K = 8,
    LC_HEADS = 32,
    LC_KVH = 4,
    LC_HD = 128,
    LC_CTX = 256,
    LC_SPLIT = 4,
    LC_LAYERS = 48,
    LC_THREADS = DQ_THREADS,
    LC_WARPS = DQ_WARPS
};
/* dec16 tile bytes: K / 64 segments of 512 data bytes and 64 scale bytes */
__host__ __device__ constexpr size_t tile_bytes(int K)
{
    return (size_t)(K / 64) * 576;
}
enum { LC_QKV_TILES = LC_QKV / 16, LC_O_TILES = LC_D / 16, LC_GU_PAIRS = LC_K * (LC_I / 16), LC_DN_TILES = LC_D / 16 };
enum { LC_PHASES = 6, LC_SUBS = 8, LC_APART = LC_HD + 2 /* o, m, l of a head's key split */ };

struct layer_w {
    const uint8_t *qkv;    /* LC_QKV_TILES tiles of K = D, each data then scales */
    const uint8_t *o;      /* LC_O_TILES tiles of K = Q */
    const float *router;   /* (E, D) */
    const uint8_t *gate;   /* E experts x (I / 16) tiles of K = D */
    const uint8_t *up;     /* the same */
    const uint8_t *down;   /* E experts x (D / 16) tiles of K = I */
    const float *kc, *vc;  /* (KVH, CTX, HD) */
};

struct lc_params {
    const layer_w *layers; /* LC_LAYERS (device) */
    float *x;              /* (D) the residual stream */
    float *qkv, *attn, *mid, *logits,
        *act;              /* phase outputs: (QKV), (HEADS, SPLIT, APART), (D), (E), (K, I) */
    unsigned *count;       /* (LC_LAYERS, LC_PHASES) arrivals, zeroed */
    int ahead;             /* 1: copy the next phase's weights before its wait; 0: after */
    int fixed;             /* with ahead: experts 0..7 every layer, their copies issued right after
                              q/k/v and o (the routing no longer delays them: its cost) */
    unsigned long long *stamp; /* (LC_LAYERS, LC_PHASES): block 0's globaltimer as each phase starts */
    unsigned long long *sub;   /* (LC_LAYERS, LC_SUBS): block 0's marks inside gate/up and down */
};

struct lc_smem {
    uint8_t *a, *b; /* weight buffers */
    uint2 *xb;      /* dec16 x fragments */
    float *part;    /* (LC_WARPS, 16 tiles, 16) partial sums */
    float *misc;    /* (LC_CTX + 32) */
};

constexpr size_t LC_A = 6 * tile_bytes(LC_D);        /* 3 gate/up pairs (>= 3 q/k/v tiles) */
constexpr size_t LC_B = 8 * tile_bytes(LC_I);        /* 8 down tiles (>= 1 o tile) */
constexpr size_t LC_XB = (size_t)LC_K * LC_I * 8;    /* 8 expert activations (>= K = 4096) */
constexpr size_t LC_PART = (size_t)LC_WARPS * 16 * 16 * 4;
constexpr size_t LC_MISC = (LC_CTX + 64) * 4;
constexpr size_t LC_SMEM = LC_A + LC_B + LC_XB + LC_PART + LC_MISC;
static_assert(tile_bytes(LC_Q) <= LC_B && 3 * tile_bytes(LC_D) <= LC_A && (size_t)LC_Q * 8 <= LC_XB, "buffers");

__device__ __forceinline__ void lc_copy(uint8_t *dst, const uint8_t *src, size_t bytes)
{
    for (size_t i = threadIdx.x * 16; i < bytes; i += LC_THREADS * 16)
        cp_async16(dst + i, src + i);
}

__device__ __forceinline__ unsigned lc_load_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long lc_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* every thread of the block after `want` blocks have arrived at *c; a chain stuck for 2 s (a bug
 * in the counts) traps instead of holding the device */
__device__ __forceinline__ void lc_wait(const unsigned *c, unsigned want)
{
    if (threadIdx.x == 0) {
        const unsigned long long t0 = lc_now();
        while (lc_load_acquire(c) < want)
            if (lc_now() - t0 > 2000000000ull) {
                printf("bench_layer_chain: block %d stuck at %u of %u arrivals\n", blockIdx.x, lc_load_acquire(c),
                       want);
                __trap();
            }
    }
    __syncthreads();
}

/* block 0 records when phase k of layer l starts (after its wait) */
__device__ __forceinline__ void lc_stamp(const lc_params &p, int l, int k)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        p.stamp[(size_t)l * LC_PHASES + k] = lc_now();
}

/* block 0's mark i inside layer l's phases */
__device__ __forceinline__ void lc_mark(const lc_params &p, int l, int i)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        p.sub[(size_t)l * LC_SUBS + i] = lc_now();
}

/* phase k of layer l: wait for its producers, then block 0 records when it starts */
__device__ __forceinline__ void lc_enter(const lc_params &p, const unsigned *c, unsigned want, int l, int k)
{
    lc_wait(c, want);
    lc_stamp(p, l, k);
}

/* this block's outputs are written: count it in */
__device__ __forceinline__ void lc_arrive(unsigned *c)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(c, 1u);
    }
}

/* y[r] (r < 16) of n tiles held in smem (tile i at w + i * tile_bytes(K)), all against the one x in
 * xb (or, with x_per_tile, tile i against x fragments xb + i * K), the warps splitting the
 * segments; out[i * 16 + r] for every tile, in the part buffer, summed over warps in order. */
__device__ void lc_tiles(const uint8_t *w, int n, int K, const uint2 *xb, bool x_per_tile, float *part,
                         float *out)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int nseg = K / 64;
    for (int i = 0; i < n; i++) {
        const uint8_t *tw = w + (size_t)i * tile_bytes(K);
        const uint4 *wd = (const uint4 *)tw;
        const uint2 *ws = (const uint2 *)(tw + (size_t)nseg * 512);
        const uint2 *xl = (x_per_tile ? xb + (size_t)i * K : xb) + (g == 0 ? t : g == 1 ? 4 + t : 8 + t);
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int s = warp; s < nseg; s += LC_WARPS)
            dec16_segment(wd[(size_t)s * 32 + lane], ws[(size_t)s * 8 + g], xl + (size_t)s * 64, acc);
        if (t == 0) {
            part[(warp * 16 + i) * 16 + g] = (acc[0] + acc[1]) * 0x1p26f;
            part[(warp * 16 + i) * 16 + g + 8] = (acc[2] + acc[3]) * 0x1p26f;
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n * 16; j += LC_THREADS) {
        float s = 0.f;
        for (int wp = 0; wp < LC_WARPS; wp++)
            s += part[(wp * 16 + j / 16) * 16 + j % 16];
        out[j] = s * rsqrtf((float)K) * 0.25f; /* keeps the random stream's magnitude near 1 */
    }
    __syncthreads();
}

__global__ void __launch_bounds__(LC_THREADS, 1) lc_kernel(const __grid_constant__ lc_params p)
{
    extern __shared__ __align__(16) uint8_t lc_raw[];
    lc_smem sm;
    sm.a = lc_raw;
    sm.b = sm.a + LC_A;
    sm.xb = (uint2 *)(sm.b + LC_B);
    sm.part = (float *)((uint8_t *)sm.xb + LC_XB);
    sm.misc = sm.part + LC_PART / 4;
    __shared__ float outs[16 * 16];
    __shared__ int ids[LC_K];
    __shared__ float rw[LC_K];
    const int b = blockIdx.x, nb = gridDim.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int n_qkv = 0;
    for (int t = b; t < LC_QKV_TILES; t += nb)
        n_qkv++;
    /* the copies of layer l's dense phases: q/k/v tiles into A, the o tile into B */
    auto copy_qkv = [&](const layer_w &L) {
        for (int i = 0, t = b; t < LC_QKV_TILES; t += nb, i++)
            lc_copy(sm.a + (size_t)i * tile_bytes(LC_D), L.qkv + (size_t)t * tile_bytes(LC_D), tile_bytes(LC_D));
        cp_async_commit();
    };
    auto copy_o = [&](const layer_w &L) {
        if (b < LC_O_TILES)
            lc_copy(sm.b, L.o + (size_t)b * tile_bytes(LC_Q), tile_bytes(LC_Q));
        cp_async_commit();
    };
    /* the experts' tiles: this block's gate/up pairs into A, its down row tile of the 8 into B */
    auto copy_gu = [&](const layer_w &L, const int *eid) {
        for (int i = 0, pr = b; pr < LC_GU_PAIRS; pr += nb, i++) {
            const int e = eid[pr / (LC_I / 16)], r = pr % (LC_I / 16);
            const size_t at = ((size_t)e * (LC_I / 16) + r) * tile_bytes(LC_D);
            lc_copy(sm.a + (size_t)(2 * i) * tile_bytes(LC_D), L.gate + at, tile_bytes(LC_D));
            lc_copy(sm.a + (size_t)(2 * i + 1) * tile_bytes(LC_D), L.up + at, tile_bytes(LC_D));
        }
        cp_async_commit();
    };
    auto copy_dn = [&](const layer_w &L, const int *eid) {
        if (b < LC_DN_TILES)
            for (int k = 0; k < LC_K; k++)
                lc_copy(sm.b + (size_t)k * tile_bytes(LC_I),
                        L.down + ((size_t)eid[k] * (LC_D / 16) + b) * tile_bytes(LC_I), tile_bytes(LC_I));
        cp_async_commit();
    };
    const int first8[LC_K] = {0, 1, 2, 3, 4, 5, 6, 7};
    if (p.ahead) {
        copy_qkv(p.layers[0]);
        copy_o(p.layers[0]);
    }
    for (int l = 0; l < LC_LAYERS; l++) {
        const layer_w L = p.layers[l];
        unsigned *cnt = p.count + (size_t)l * LC_PHASES;
        /* P0: q/k/v from x (the previous layer's P5) */
        if (l > 0)
            lc_wait(p.count + (size_t)(l - 1) * LC_PHASES + 5, LC_DN_TILES < nb ? LC_DN_TILES : nb);
        lc_stamp(p, l, 0);
        if (!p.ahead)
            copy_qkv(L);
        dec16_stage_x(sm.xb, p.x, LC_D, [] {});
        cp_async_wait_upto(p.ahead ? 1 : 0); /* the q/k/v group (ahead: o's may still fly) */
        __syncthreads();
        lc_tiles(sm.a, n_qkv, LC_D, sm.xb, false, sm.part, outs);
        for (int i = threadIdx.x; i < n_qkv * 16; i += LC_THREADS)
            p.qkv[(size_t)(b + (i / 16) * nb) * 16 + i % 16] = outs[i];
        lc_arrive(cnt + 0);
        if (p.fixed) /* A is free */
            copy_gu(L, first8);
        /* P1: attention, a block a (query head, key split): its partial o, max and sum; the o blocks
         * merge the splits as they stage x (the production decode attention's split-K) */
        lc_enter(p, cnt + 0, nb, l, 1);
        if (b < LC_HEADS * LC_SPLIT) {
            const int h = b / LC_SPLIT, j0 = (b % LC_SPLIT) * (LC_CTX / LC_SPLIT);
            constexpr int NJ = LC_CTX / LC_SPLIT, JW = NJ / LC_WARPS;
            const float *q = p.qkv + (size_t)h * LC_HD;
            const float *kc = L.kc + ((size_t)(h / (LC_HEADS / LC_KVH)) * LC_CTX + j0) * LC_HD;
            const float *vc = L.vc + ((size_t)(h / (LC_HEADS / LC_KVH)) * LC_CTX + j0) * LC_HD;
            float *sc = sm.misc;
            const float4 qv = ((const float4 *)q)[lane];
            float4 kv[JW];
#pragma unroll
            for (int i = 0; i < JW; i++)
                kv[i] = ((const float4 *)(kc + (size_t)(warp * JW + i) * LC_HD))[lane];
#pragma unroll
            for (int i = 0; i < JW; i++) {
                float d = qv.x * kv[i].x + qv.y * kv[i].y + qv.z * kv[i].z + qv.w * kv[i].w;
                for (int o = 16; o > 0; o >>= 1)
                    d += __shfl_xor_sync(0xffffffffu, d, o);
                if (lane == 0)
                    sc[warp * JW + i] = d * 0.08838834764831845f;
            }
            __syncthreads();
            float mx = -INFINITY;
            for (int j = 0; j < NJ; j++)
                mx = fmaxf(mx, sc[j]);
            __syncthreads();
            if (threadIdx.x < NJ)
                sc[threadIdx.x] = expf(sc[threadIdx.x] - mx);
            __syncthreads();
            if (threadIdx.x < LC_HD) {
                float s0 = 0.f, o = 0.f;
#pragma unroll 16
                for (int j = 0; j < NJ; j++) {
                    s0 += sc[j];
                    o += sc[j] * vc[(size_t)j * LC_HD + threadIdx.x];
                }
                float *out = p.attn + (size_t)b * LC_APART;
                out[threadIdx.x] = o;
                if (threadIdx.x == 0)
                    out[LC_HD] = mx, out[LC_HD + 1] = s0;
            }
            lc_arrive(cnt + 1);
        }
        /* P2: o from the heads */
        lc_enter(p, cnt + 1, LC_HEADS * LC_SPLIT, l, 2);
        if (!p.ahead)
            copy_o(L);
        if (b < LC_O_TILES) {
            float *merged = (float *)(sm.xb + LC_Q); /* xb's room past o's K fragments: 16 KB */
            for (int i = threadIdx.x; i < LC_Q; i += LC_THREADS) {
                const float *pt = p.attn + (size_t)(i / LC_HD) * LC_SPLIT * LC_APART;
                float m = -INFINITY;
                for (int s2 = 0; s2 < LC_SPLIT; s2++)
                    m = fmaxf(m, pt[s2 * LC_APART + LC_HD]);
                float num = 0.f, den = 0.f;
                for (int s2 = 0; s2 < LC_SPLIT; s2++) {
                    const float w = expf(pt[s2 * LC_APART + LC_HD] - m);
                    num += w * pt[s2 * LC_APART + i % LC_HD];
                    den += w * pt[s2 * LC_APART + LC_HD + 1];
                }
                merged[i] = num / den;
            }
            __syncthreads();
            dec16_stage_x(sm.xb, merged, LC_Q, [] {});
            cp_async_wait_upto(p.fixed ? 1 : 0); /* o's group (fixed: the experts' gate/up may fly) */
            __syncthreads();
            lc_tiles(sm.b, 1, LC_Q, sm.xb, false, sm.part, outs);
            if (threadIdx.x < 16)
                p.mid[b * 16 + threadIdx.x] = p.x[b * 16 + threadIdx.x] + outs[threadIdx.x];
            lc_arrive(cnt + 2);
        } else {
            cp_async_wait_upto(p.fixed ? 1 : 0);
        }
        if (p.fixed) /* B is free */
            copy_dn(L, first8);
        /* P3: router logits, a block a row */
        lc_enter(p, cnt + 2, LC_O_TILES, l, 3);
        if (b < LC_E) {
            const float *r = L.router + (size_t)b * LC_D;
            float s = 0.f;
            for (int i = threadIdx.x; i < LC_D; i += LC_THREADS)
                s += r[i] * p.mid[i];
            for (int o = 16; o > 0; o >>= 1)
                s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0)
                sm.misc[warp] = s;
            __syncthreads();
            if (threadIdx.x == 0) {
                float t = 0.f;
                for (int w = 0; w < LC_WARPS; w++)
                    t += sm.misc[w];
                p.logits[b] = t;
            }
            lc_arrive(cnt + 3);
        }
        /* P4: top-8 (every block), the experts' weights, SiLU(gate) * up */
        lc_enter(p, cnt + 3, LC_E, l, 4);
        /* top-8 by ranks: thread i counts the logits that beat its own (ties: the lower index) */
        if (threadIdx.x < LC_E)
            sm.misc[threadIdx.x] = p.logits[threadIdx.x];
        __syncthreads();
        if (threadIdx.x < LC_E) {
            const float v = sm.misc[threadIdx.x];
            int rank = 0;
#pragma unroll 8
            for (int j = 0; j < LC_E; j++) {
                const float u = sm.misc[j];
                rank += u > v || (u == v && j < (int)threadIdx.x);
            }
            if (rank < LC_K)
                ids[rank] = threadIdx.x, rw[rank] = v;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float tot = 0.f;
            for (int k = 0; k < LC_K; k++)
                tot += (rw[k] = expf(rw[k] - rw[0]));
            for (int k = 0; k < LC_K; k++)
                rw[k] /= tot;
        }
        __syncthreads();
        int n_pairs = 0;
        for (int pr = b; pr < LC_GU_PAIRS; pr += nb)
            n_pairs++;
        lc_mark(p, l, 0);
        if (!p.fixed) {
            copy_gu(L, ids);
            copy_dn(L, ids);
        }
        lc_mark(p, l, 1);
        dec16_stage_x(sm.xb, p.mid, LC_D, [] {});
        lc_mark(p, l, 2);
        cp_async_wait_upto(1);
        __syncthreads();
        lc_mark(p, l, 3);
        lc_tiles(sm.a, 2 * n_pairs, LC_D, sm.xb, false, sm.part, outs);
        lc_mark(p, l, 4);
        for (int i = threadIdx.x; i < n_pairs * 16; i += LC_THREADS) {
            const int pr = b + (i / 16) * nb, k = pr / (LC_I / 16), row = (pr % (LC_I / 16)) * 16 + i % 16;
            const float gt = outs[(2 * (i / 16)) * 16 + i % 16], u = outs[(2 * (i / 16) + 1) * 16 + i % 16];
            p.act[(size_t)k * LC_I + row] = gt / (1.0f + expf(-gt)) * u;
        }
        lc_arrive(cnt + 4);
        if (p.ahead && l + 1 < LC_LAYERS) /* A is free: the next layer's q/k/v */
            copy_qkv(p.layers[l + 1]);
        /* P5: down for the 8 experts, combined, + residual */
        lc_enter(p, cnt + 4, nb, l, 5);
        if (b < LC_DN_TILES) {
            for (int k = 0; k < LC_K; k++)
                dec16_stage_x(sm.xb + (size_t)k * LC_I, p.act + (size_t)k * LC_I, LC_I, [] {});
            lc_mark(p, l, 5);
            cp_async_wait_upto(p.ahead && l + 1 < LC_LAYERS ? 1 : 0); /* the down group */
            __syncthreads();
            lc_mark(p, l, 6);
            lc_tiles(sm.b, LC_K, LC_I, sm.xb, true, sm.part, outs);
            lc_mark(p, l, 7);
            if (threadIdx.x < 16) {
                float s = 0.f;
                for (int k = 0; k < LC_K; k++)
                    s += rw[k] * outs[k * 16 + threadIdx.x];
                p.x[b * 16 + threadIdx.x] = p.mid[b * 16 + threadIdx.x] + s;
            }
            lc_arrive(cnt + 5);
        }
        cp_async_wait_upto(p.ahead && l + 1 < LC_LAYERS ? 1 : 0);
        if (p.ahead && l + 1 < LC_LAYERS) /* B is free: the next layer's o */
            copy_o(p.layers[l + 1]);
    }
    cp_async_wait_upto(0);
}

/* the chain alone: the same six waits and arrivals a layer by the same blocks, no work: the floor
 * of the counter chain itself */
__global__ void __launch_bounds__(LC_THREADS, 1) lc_sync_kernel(const __grid_constant__ lc_params p)
{
    const int b = blockIdx.x, nb = gridDim.x;
    const unsigned arrive_n[LC_PHASES] = {(unsigned)nb, LC_HEADS * LC_SPLIT,
                                          LC_O_TILES,   LC_E,
                                          (unsigned)nb, (unsigned)(LC_DN_TILES < nb ? LC_DN_TILES : nb)};
    for (int l = 0; l < LC_LAYERS; l++) {
        unsigned *cnt = p.count + (size_t)l * LC_PHASES;
        for (int k = 0; k < LC_PHASES; k++) {
            if (k > 0)
                lc_enter(p, cnt + k - 1, arrive_n[k - 1], l, k);
            else if (l > 0)
                lc_enter(p, p.count + (size_t)(l - 1) * LC_PHASES + 5, arrive_n[5], l, 0);
            else
                lc_stamp(p, l, 0);
            if ((unsigned)b < arrive_n[k])
                lc_arrive(cnt + k);
        }
    }
}

void fill(std::vector<uint8_t> &v, std::mt19937_64 &rng)
{
    size_t i = 0;
    for (; i + 8 <= v.size(); i += 8) {
        const uint64_t r = rng();
        memcpy(&v[i], &r, 8);
    }
    for (; i < v.size(); i++)
        v[i] = (uint8_t)rng();
}

} // namespace

int main()
{
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (sms < LC_E || sms < LC_O_TILES) {
        fprintf(stderr, "bench_layer_chain: written for >= 128 SMs (a router row and an o tile a block); %d\n", sms);
        return 1;
    }
    std::mt19937_64 rng(11);
    const size_t qkv_b = (size_t)LC_QKV_TILES * tile_bytes(LC_D), o_b = (size_t)LC_O_TILES * tile_bytes(LC_Q);
    const size_t gu_b = (size_t)LC_E * (LC_I / 16) * tile_bytes(LC_D);
    const size_t dn_b = (size_t)LC_E * (LC_D / 16) * tile_bytes(LC_I);
    const size_t kv_b = (size_t)LC_KVH * LC_CTX * LC_HD * 4;
    /* random bytes, the scale bytes kept finite and small (e4m3 exponent <= 7); one random image
     * per kind of weight, copied to every layer's own memory (distinct addresses: nothing shared
     * in L2) */
    std::vector<uint8_t> img_d(gu_b), img_i(dn_b);
    for (auto *im : {&img_d, &img_i}) {
        fill(*im, rng);
        const int K = im == &img_d ? LC_D : LC_I;
        const size_t tb = tile_bytes(K), data = (size_t)(K / 64) * 512;
        for (size_t t = 0; (t + 1) * tb <= im->size(); t++)
            for (size_t i = data; i < tb; i++)
                (*im)[t * tb + i] &= 0x3f;
    }
    std::vector<uint8_t> img_q(o_b);
    fill(img_q, rng);
    for (size_t t = 0; (t + 1) * tile_bytes(LC_Q) <= o_b; t++)
        for (size_t i = (size_t)(LC_Q / 64) * 512; i < tile_bytes(LC_Q); i++)
            img_q[t * tile_bytes(LC_Q) + i] &= 0x3f;
    auto rand_tiles = [&](size_t bytes, int K) {
        const std::vector<uint8_t> &im = K == LC_D ? img_d : K == LC_I ? img_i : img_q;
        uint8_t *d;
        CK(cudaMalloc(&d, bytes));
        CK(cudaMemcpy(d, im.data(), bytes, cudaMemcpyHostToDevice));
        return d;
    };
    auto rand_floats = [&](size_t n, float scale) {
        std::vector<float> f(n);
        std::uniform_real_distribution<float> u(-scale, scale);
        for (auto &x : f)
            x = u(rng);
        float *d;
        CK(cudaMalloc(&d, n * 4));
        CK(cudaMemcpy(d, f.data(), n * 4, cudaMemcpyHostToDevice));
        return d;
    };
    std::vector<layer_w> layers(LC_LAYERS);
    for (int l = 0; l < LC_LAYERS; l++) {
        layers[l].qkv = rand_tiles(qkv_b, LC_D);
        layers[l].o = rand_tiles(o_b, LC_Q);
        layers[l].router = rand_floats((size_t)LC_E * LC_D, 0.05f);
        layers[l].gate = rand_tiles(gu_b, LC_D);
        layers[l].up = rand_tiles(gu_b, LC_D);
        layers[l].down = rand_tiles(dn_b, LC_I);
        layers[l].kc = rand_floats(kv_b / 4, 1.0f);
        layers[l].vc = rand_floats(kv_b / 4, 1.0f);
    }
    printf("weights: %.2f GB over %d layers (%.1f MB a layer, %.1f MB read at batch 1)\n",
           (double)LC_LAYERS * (qkv_b + o_b + 2 * gu_b + dn_b) / 1e9, LC_LAYERS,
           (double)(qkv_b + o_b + 2 * gu_b + dn_b) / 1e6,
           (double)(qkv_b + o_b + LC_K * (2 * gu_b + dn_b) / LC_E) / 1e6);
    layer_w *d_layers, *d_hot;
    CK(cudaMalloc(&d_layers, sizeof(layer_w) * LC_LAYERS));
    CK(cudaMemcpy(d_layers, layers.data(), sizeof(layer_w) * LC_LAYERS, cudaMemcpyHostToDevice));
    std::vector<layer_w> hot(LC_LAYERS, layers[0]);
    CK(cudaMalloc(&d_hot, sizeof(layer_w) * LC_LAYERS));
    CK(cudaMemcpy(d_hot, hot.data(), sizeof(layer_w) * LC_LAYERS, cudaMemcpyHostToDevice));
    lc_params p = {};
    p.x = rand_floats(LC_D, 1.0f);
    float *x0;
    CK(cudaMalloc(&x0, LC_D * 4));
    CK(cudaMemcpy(x0, p.x, LC_D * 4, cudaMemcpyDeviceToDevice));
    CK(cudaMalloc(&p.qkv, LC_QKV * 4));
    CK(cudaMalloc(&p.attn, (size_t)LC_HEADS * LC_SPLIT * LC_APART * 4));
    CK(cudaMalloc(&p.mid, LC_D * 4));
    CK(cudaMalloc(&p.logits, LC_E * 4));
    CK(cudaMalloc(&p.act, LC_K * LC_I * 4));
    const size_t cnt_b = (size_t)LC_LAYERS * LC_PHASES * 4;
    CK(cudaMalloc(&p.count, cnt_b));
    CK(cudaMalloc(&p.stamp, (size_t)LC_LAYERS * LC_PHASES * 8));
    CK(cudaMalloc(&p.sub, (size_t)LC_LAYERS * LC_SUBS * 8));
    CK(cudaFuncSetAttribute(lc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)LC_SMEM));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, lc_kernel, LC_THREADS, LC_SMEM));
    if (per_sm < 1) {
        fprintf(stderr, "bench_layer_chain: %zu bytes of shared memory do not fit an SM\n", LC_SMEM);
        return 1;
    }
    printf("%d SMs, one block each (co-resident: %d an SM), %zu bytes of shared memory a block\n", sms, per_sm,
           LC_SMEM);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct variant {
        const char *name;
        layer_w *layers;
        int ahead, fixed, sync_only;
    } vs[] = {{"ahead", d_layers, 1, 0, 0},
              {"after", d_layers, 0, 0, 0},
              {"fixed", d_layers, 1, 1, 0},
              {"hot", d_hot, 1, 0, 0},
              {"sync", d_layers, 1, 0, 1}};
    printf("%-8s %12s %12s %10s   %s\n", "variant", "us a layer", "us a step", "checksum",
           "block 0's phases, us (q/k/v, attention, o, router, gate/up, down), layers 1..46");
    for (const variant &v : vs) {
        float best = 1e30f;
        double sum = 0;
        for (int rep = 0; rep < 5; rep++) {
            CK(cudaMemcpy(p.x, x0, LC_D * 4, cudaMemcpyDeviceToDevice));
            CK(cudaMemset(p.count, 0, cnt_b));
            p.layers = v.layers;
            p.ahead = v.ahead;
            p.fixed = v.fixed;
            CK(cudaEventRecord(e0));
            if (v.sync_only)
                lc_sync_kernel<<<sms, LC_THREADS>>>(p);
            else
                lc_kernel<<<sms, LC_THREADS, LC_SMEM>>>(p); /* one block an SM: every block is resident */
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            best = ms < best ? ms : best;
            std::vector<float> hx(LC_D);
            CK(cudaMemcpy(hx.data(), p.x, LC_D * 4, cudaMemcpyDeviceToHost));
            sum = 0;
            for (float f : hx)
                sum += f;
        }
        std::vector<unsigned long long> st((size_t)LC_LAYERS * LC_PHASES);
        CK(cudaMemcpy(st.data(), p.stamp, st.size() * 8, cudaMemcpyDeviceToHost));
        double ph[LC_PHASES] = {0};
        for (int l = 1; l + 1 < LC_LAYERS; l++)
            for (int k = 0; k < LC_PHASES; k++) {
                const unsigned long long end = k + 1 < LC_PHASES ? st[(size_t)l * LC_PHASES + k + 1]
                                                                 : st[(size_t)(l + 1) * LC_PHASES];
                ph[k] += (double)(end - st[(size_t)l * LC_PHASES + k]) / 1000.0 / (LC_LAYERS - 2);
            }
        printf("%-8s %12.2f %12.1f %10.4g  ", v.name, best * 1000.0f / LC_LAYERS, best * 1000.0f, sum);
        for (int k = 0; k < LC_PHASES; k++)
            printf(" %6.2f", ph[k]);
        printf("   (the last run's)\n");
        /* inside gate/up: from its start to marks 0..4 and on to down's start; inside down: from
         * its start to marks 5..7 and on to the next layer's start */
        std::vector<unsigned long long> sb((size_t)LC_LAYERS * LC_SUBS);
        CK(cudaMemcpy(sb.data(), p.sub, sb.size() * 8, cudaMemcpyDeviceToHost));
        double gu[6] = {0}, dn[4] = {0};
        for (int l = 1; l + 1 < LC_LAYERS; l++) {
            const unsigned long long *S = &st[(size_t)l * LC_PHASES], *M = &sb[(size_t)l * LC_SUBS];
            const unsigned long long gm[6] = {M[0], M[1], M[2], M[3], M[4], S[5]};
            unsigned long long prev = S[4];
            for (int i = 0; i < 6; i++)
                gu[i] += (double)(gm[i] - prev) / 1000.0 / (LC_LAYERS - 2), prev = gm[i];
            const unsigned long long dm[4] = {M[5], M[6], M[7], S[LC_PHASES]};
            prev = S[5];
            for (int i = 0; i < 4; i++)
                dn[i] += (double)(dm[i] - prev) / 1000.0 / (LC_LAYERS - 2), prev = dm[i];
        }
        if (v.sync_only)
            continue;
        printf("%-8s gate/up: top-k %.2f, copies issued %.2f, x staged %.2f, copies landed %.2f, dots %.2f, "
               "arrivals %.2f; down: x staged %.2f, copies landed %.2f, dots %.2f, arrivals %.2f\n",
               "", gu[0], gu[1], gu[2], gu[3], gu[4], gu[5], dn[0], dn[1], dn[2], dn[3]);
    }
    return 0;
}
