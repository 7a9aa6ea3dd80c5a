/* cuda_decode_mma.cuh — the device pieces of the NVFP4 decode on bf16 tensor cores that the
 * kernels of cuda_decode_mma.cu are built from: x staged as mma A fragments (E2M1 pairs to bf16x2:
 * cuda_common.cuh), one 8-row warp tile's dot product (weights in registers or staged through shared memory),
 * the GEMV job table. The scheme is explained at the top of cuda_decode_mma.cu.
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_DECODE_MMA_CUH
#define MOESERVE_BACKEND_CUDA_CUDA_DECODE_MMA_CUH

#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/decode/cuda_decode_limits.h"

namespace
{

__device__ __forceinline__ uint32_t bf16x2_of(float lo, float hi)
{
    uint32_t a = __float_as_uint(lo), b = __float_as_uint(hi);
    /* round to nearest even, as __float2bfloat16_rn (finite inputs) */
    a = (a + 0x7fffu + ((a >> 16) & 1u)) >> 16;
    b = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    return (b << 16) | (a & 0xffffu);
}

__device__ __forceinline__ float bf16_round(float v)
{
    uint32_t a = __float_as_uint(v);
    a = (a + 0x7fffu + ((a >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(a);
}

/* x[0 .. K) into A fragments: uint4 entry ((c / 4) * 8 + w * 2 + h) * 4 + (c % 4) is {a0, a1,
 * a2, a3} of lane (0, c % 4) for chunk c, word w, half h: a0 and a2 the bf16 of x (A row 0),
 * a1 and a3 the rest x - hi rounded again (A row 8), so that one 16-byte shared load fills the
 * mma's A registers and the hi and lo sums come back in the same lane (C rows 0 and 8). The other
 * lanes' A is zero (xfrag_zeros). Threads tid0, tid0 + stride, ... of the caller. x is read XB
 * entries at a time, all loads issued before the first store: x was just written by the previous
 * kernel, so each batch is an L2 round trip (~0.6 us), and one entry at a time would make the down
 * kernel's per-warp staging (6 entries a lane) six of them in a row. */
__device__ __forceinline__ void xfrag_load(const float *x, int it, float2 &a, float2 &b)
{
    const int c = it / 8, w = (it / 2) % 4, h = it % 2, k0 = 32 * c + 8 * w + 2 * h;
    a = *(const float2 *)(x + k0); /* x: global or shared */
    b = *(const float2 *)(x + k0 + 4);
}

__device__ __forceinline__ void xfrag_put(uint2 *xf2, int it, float2 a, float2 b)
{
    const int c = it / 8, w = (it / 2) % 4, h = it % 2;
    const float v0 = a.x, v1 = a.y, v4 = b.x, v5 = b.y;
    const float h0 = bf16_round(v0), h4 = bf16_round(v4), h1 = bf16_round(v1), h5 = bf16_round(v5);
    ((uint4 *)xf2)[((c / 4) * 8 + w * 2 + h) * 4 + (c % 4)] =
        make_uint4(bf16x2_of(h0, h4), bf16x2_of(v0 - h0, v4 - h4), bf16x2_of(h1, h5), bf16x2_of(v1 - h1, v5 - h5));
}

/* Entries [lo, hi) of x's fragments (a chunk group g is entries [32 g, 32 g + 32), at the same
 * places as in the whole-K layout), XB loads a thread in flight before their stores. */
__device__ __forceinline__ void xfrag_stage_span(uint2 *xf, const float *x, int lo, int hi, int tid0, int stride)
{
    constexpr int XB = 4;
    for (int it0 = lo + tid0; it0 < hi; it0 += XB * stride) {
        float2 a[XB], b[XB]; /* x[k0], x[k0 + 1] and x[k0 + 4], x[k0 + 5] */
#pragma unroll
        for (int i = 0; i < XB; i++)
            if (it0 + i * stride < hi)
                xfrag_load(x, it0 + i * stride, a[i], b[i]);
#pragma unroll
        for (int i = 0; i < XB; i++)
            if (it0 + i * stride < hi)
                xfrag_put(xf, it0 + i * stride, a[i], b[i]);
    }
}

__device__ __forceinline__ void xfrag_stage(uint2 *xf, const float *x, int K, int tid0, int stride)
{
    xfrag_stage_span(xf, x, 0, K / 4, tid0, stride);
}

/* As xfrag_stage, with between() run after this thread's loads of x are issued and before their
 * values are used, when the thread's share fits NIT entries (else between() first). The MoE
 * kernels issue their weight loads there: issued before x's, they would make x's (an L2 hit)
 * come back only after them, so staging would wait out the weights' whole DRAM round trip and no
 * arithmetic would overlap the transfer (a block trace on the H200, docs/lab/journal.md). */
template <int NIT, typename F>
__device__ __forceinline__ void xfrag_stage_around_span(uint2 *xf, const float *x, int lo, int hi, int tid0,
                                                        int stride, F &&between)
{
    if (hi - lo > NIT * stride) {
        between();
        xfrag_stage_span(xf, x, lo, hi, tid0, stride);
        return;
    }
    float2 a[NIT], b[NIT];
#pragma unroll
    for (int i = 0; i < NIT; i++)
        if (lo + tid0 + i * stride < hi)
            xfrag_load(x, lo + tid0 + i * stride, a[i], b[i]);
    between();
#pragma unroll
    for (int i = 0; i < NIT; i++)
        if (lo + tid0 + i * stride < hi)
            xfrag_put(xf, lo + tid0 + i * stride, a[i], b[i]);
}

template <int NIT, typename F>
__device__ __forceinline__ void xfrag_stage_around(uint2 *xf, const float *x, int K, int tid0, int stride,
                                                   F &&between)
{
    xfrag_stage_around_span<NIT>(xf, x, 0, K / 4, tid0, stride, between);
}

/* One chunk group's worth of zero A fragments for lanes 1..31's rows, in the kernel's static
 * shared memory. Every kernel using chunk_mma calls xfrag_zeros_init() once and synchronises
 * before its first dot product. */
__device__ __forceinline__ uint4 *xfrag_zeros()
{
    __shared__ uint4 z[32];
    return z;
}

__device__ __forceinline__ void xfrag_zeros_init()
{
    if (threadIdx.x < 32)
        xfrag_zeros()[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
}

/* The fragments lane `lane` multiplies for chunk group i: its own for lanes 0..3 (g = 0), zeros
 * for the rest. */
__device__ __forceinline__ const uint4 *xfrag_group(const uint2 *xf, int i, int lane)
{
    return lane < 4 ? (const uint4 *)xf + (size_t)i * 32 : xfrag_zeros();
}

/* The same for T <= 8 tokens staged one after the other (K / 4 uint4 each): lane g < T takes
 * token g's, so A's rows g and g + 8 are token g's hi and lo and C's rows g and g + 8 its two
 * halves of the products; the mma costs what it costs for one token. */
__device__ __forceinline__ const uint4 *xfrag_group_tokens(const uint2 *xf, int i, int lane, int T, int64_t K)
{
    const int g = lane / 4;
    return g < T ? (const uint4 *)xf + (size_t)g * (size_t)(K / 4) + (size_t)i * 32 : xfrag_zeros();
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

struct chunk16 {
    uint4 w;
    uint32_t s; /* the chunk's two scale bytes */
};

/* One chunk (32 k of row g) against x's fragments xg (xfrag_group of this chunk's group of four):
 * 8 mma steps into d (two sets, alternating, so that consecutive mmas do not wait on each other). */
__device__ __forceinline__ void chunk_mma(const chunk16 &q, const uint4 *xg, int lane, float (&d0)[4], float (&d1)[4])
{
    const int t = lane % 4;
    uint32_t s_lo, s_hi;
    scales_x2(q.s, s_lo, s_hi);
    const uint32_t words[4] = {q.w.x, q.w.y, q.w.z, q.w.w};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const uint32_t u = words[w], sc = w < 2 ? s_lo : s_hi;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t b0 = h == 0 ? e2m1x2_raw<0>(u) : e2m1x2_raw<2>(u);
            uint32_t b1 = h == 0 ? e2m1x2_raw<1>(u) : e2m1x2_raw<3>(u);
            b0 = bf16x2_fma(b0, sc, 0x80008000u);
            b1 = bf16x2_fma(b1, sc, 0x80008000u);
            const uint4 a = xg[(w * 2 + h) * 4 + t];
            if (h == 0)
                mma_bf16_16816(d0, a, b0, b1);
            else
                mma_bf16_16816(d1, a, b0, b1);
        }
    }
}

__device__ __forceinline__ chunk16 load_chunk(const cuda_wdev &w, int64_t row, int64_t c, int64_t K, bool ok)
{
    chunk16 q;
    q.w = make_uint4(0u, 0u, 0u, 0u);
    q.s = 0u;
    if (ok) {
        q.w = __ldg((const uint4 *)((const uint8_t *)w.data + row * (K / 2)) + c);
        q.s = __ldg((const uint16_t *)((const uint8_t *)w.scale + row * (K / 16)) + c);
    }
    return q;
}

/* The first U chunk groups of [g0, g1) of row `row` (ok: it exists): what a kernel may load
 * before it waits for its predecessor or stages x (weights never change). */
template <int U>
__device__ __forceinline__ void rows8_prefetch(const cuda_wdev &w, int64_t row, bool ok, int64_t K, int g0, int g1,
                                               chunk16 (&q)[U])
{
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int u = 0; u < U; u++)
        q[u] = load_chunk(w, row, 4 * (g0 + u) + t, K, ok && g0 + u < g1);
}

/* A warp tile's two accumulators as the sums of rows 2t, 2t + 1: C rows g (x's hi) and g + 8 (its
 * lo) of columns 2t, 2t + 1, token g's in lanes 4g .. 4g + 3. */
__device__ __forceinline__ float2 rows8_result(const float (&d0)[4], const float (&d1)[4])
{
    return make_float2((d0[0] + d1[0]) + (d0[2] + d1[2]), (d0[1] + d1[1]) + (d0[3] + d1[3]));
}

/* Row g (of the warp's 8) of weight w, row index `row` (ok: it exists), dotted with x over the
 * chunk groups [g0, g1) (a group: 4 chunks, 128 k; fragments xf for the whole K), the first
 * U groups already in pre, U more per round after: returns in lanes 0..3 the raw sums of rows
 * 2t and 2t + 1 (times 2^-62). The sums are added group by group in order. */
template <int U>
__device__ __forceinline__ float2 rows8_dot_range(const cuda_wdev &w, int64_t row, bool ok, int64_t K,
                                                  const uint2 *xf, int g0, int g1, const chunk16 (&pre)[U],
                                                  int T = 1)
{
    const int lane = threadIdx.x % 32, t = lane % 4;
    float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
    /* rolling: as soon as group i is multiplied, its registers ask for group i + U, so U groups
     * stay in flight the whole way instead of the warp draining them and waiting a full round
     * trip for the next U */
    chunk16 q[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        q[u] = pre[u];
    for (int i0 = g0; i0 < g1; i0 += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (i0 + u < g1) {
                chunk_mma(q[u],
                          T == 1 ? xfrag_group(xf, i0 + u, lane) : xfrag_group_tokens(xf, i0 + u, lane, T, K),
                          lane, d0, d1);
                if (i0 + u + U < g1)
                    q[u] = load_chunk(w, row, 4 * (i0 + u + U) + t, K, ok);
            }
        }
    }
    return rows8_result(d0, d1);
}

/* TPW row tiles of a warp as one stream of chunk groups (tile 0's [g0, g1), then tile 1's, ...;
 * tile tt is rows row0 + 8 tt, row0 being the lane's row of tile 0, rows >= D absent): the loads
 * roll across the tiles' boundaries, so a tile's first groups are in flight while the previous
 * tile's last are multiplied, where rows8_dot_range per tile drains its window at each tile's end
 * and waits a whole round trip for the next. The stream's first U groups (tile 0's, then tile
 * 1's where a tile has fewer): */
template <int U, int TPW>
__device__ __forceinline__ void rows8_stream_prefetch(const cuda_wdev &w, int64_t row0, int64_t D, int64_t K, int g0,
                                                      int g1, chunk16 (&q)[U])
{
    const int t = threadIdx.x % 4;
    int tt = 0, gi = g0;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t row = row0 + 8 * tt;
        q[u] = load_chunk(w, row, 4 * gi + t, K, tt < TPW && row < D && gi < g1);
        if (++gi >= g1)
            gi = g0, tt++;
    }
}

/* ... and its sums: res[tt] = rows8_dot_range's result for tile tt, the same sums in the same
 * order (so the same bits); pre = rows8_stream_prefetch's groups. */
template <int U, int TPW>
__device__ __forceinline__ void rows8_stream_dot(const cuda_wdev &w, int64_t row0, int64_t D, int64_t K,
                                                 const uint2 *xf, int g0, int g1, const chunk16 (&pre)[U],
                                                 float2 (&res)[TPW])
{
    const int lane = threadIdx.x % 32, t = lane % 4;
    float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
    chunk16 q[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        q[u] = pre[u];
#pragma unroll
    for (int k = 0; k < TPW; k++)
        res[k] = make_float2(0.f, 0.f);
    if (g1 <= g0)
        return;
    int ct = 0, cg = g0, lt = 0, lg = g0; /* the group multiplied next, the group loaded next */
#pragma unroll
    for (int u = 0; u < U; u++)
        if (++lg >= g1)
            lg = g0, lt++;
    while (ct < TPW) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (ct < TPW) {
                chunk_mma(q[u], xfrag_group(xf, cg, lane), lane, d0, d1);
                if (lt < TPW) {
                    const int64_t row = row0 + 8 * lt;
                    q[u] = load_chunk(w, row, 4 * lg + t, K, row < D);
                    if (++lg >= g1)
                        lg = g0, lt++;
                }
                if (++cg >= g1) {
                    const float2 r = rows8_result(d0, d1);
#pragma unroll
                    for (int k = 0; k < TPW; k++)
                        if (k == ct)
                            res[k] = r;
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        d0[e] = d1[e] = 0.f;
                    cg = g0, ct++;
                }
            }
        }
    }
}

/* Weights staged through shared memory instead of registers (the smem_tpw form of the MoE pair
 * kernels, which the backend runs from 2 tokens): cp.async copies global memory into shared
 * memory without holding a register until the data arrives, so a warp has all of its rows in
 * flight at once and the kernel keeps few registers: more blocks resident (H200, batch 8: 939 vs
 * 902 tok/s, docs/lab/journal.md). At batch 1 it is slower (389 vs 411): a warp stalls issuing
 * its 32 copies once the SM's outstanding requests are used up, so its dot starts later than the
 * register form's. A warp's area: NG groups of 32 lanes x 16 bytes (lane (g, t)'s chunk 4i + t
 * of row g at [i][lane]: each lane reads back what it copied, 16 consecutive bytes a lane, no bank
 * conflict), then NG x 8 rows x 8 bytes of scales (row g's four chunks of group i, copied by lane
 * t = 0). RS8_GROUP_BYTES a group. */

/* The warp's rows (row g of weight w at `row`, ok: it exists) over chunk groups [g0, g1) into
 * its area `area` (RS8_GROUP_BYTES x (g1 - g0)), committed `batch` groups at a time: returns the
 * number of commit groups, which rows8_dot_smem() waits on one by one. Missing rows get zeros.
 * Needs K % 128 == 0 and the scales 8-byte aligned (cuda_moe_decode_mma checks). */
__device__ __forceinline__ int rows8_stage_async(const cuda_wdev &w, int64_t row, bool ok, int64_t K, int g0,
                                                 int g1, uint8_t *area, int batch)
{
    const int lane = threadIdx.x % 32, t = lane % 4, g = lane / 4, ng = g1 - g0;
    uint4 *sd = (uint4 *)area;
    uint2 *ss = (uint2 *)(area + (size_t)ng * 512);
    const uint8_t *drow = (const uint8_t *)w.data + row * (K / 2), *srow = (const uint8_t *)w.scale + row * (K / 16);
    int commits = 0;
    for (int i = 0; i < ng; i++) {
        if (ok)
            cp_async16(sd + i * 32 + lane, drow + (size_t)(4 * (g0 + i) + t) * 16);
        else
            sd[i * 32 + lane] = make_uint4(0u, 0u, 0u, 0u);
        if (t == 0) {
            if (ok)
                cp_async8(ss + i * 8 + g, srow + (size_t)(g0 + i) * 8);
            else
                ss[i * 8 + g] = make_uint2(0u, 0u);
        }
        if (i % batch == batch - 1 || i == ng - 1) {
            cp_async_commit();
            commits++;
        }
    }
    return commits;
}

/* rows8_dot_range's sums (the same order, so the same bits) from a warp area that
 * rows8_stage_async filled with groups [g0, g1) in `commits` commit groups of `batch`: each batch
 * is multiplied as soon as it has arrived. */
__device__ __forceinline__ float2 rows8_dot_smem(const uint8_t *area, const uint2 *xf, int g0, int g1,
                                                 int batch, int commits)
{
    const int lane = threadIdx.x % 32, ng = g1 - g0;
    const uint4 *sd = (const uint4 *)area;
    const uint16_t *ss = (const uint16_t *)(area + (size_t)ng * 512);
    float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
    for (int b = 0; b < commits; b++) {
        cp_async_wait_upto(commits - 1 - b);
        __syncwarp(); /* the other lanes' copies (the scales) and zero stores */
        for (int i = b * batch; i < ng && i < (b + 1) * batch; i++) {
            chunk16 q;
            q.w = sd[i * 32 + lane];
            q.s = ss[(i * 8 + lane / 4) * 4 + lane % 4];
            chunk_mma(q, xfrag_group(xf, g0 + i, lane), lane, d0, d1);
        }
    }
    return rows8_result(d0, d1);
}

/* A GEMV launcher's job table (p.w, p.N, p.y, p.first_tile of gemv_mma's parameters) for n_w
 * weights in tiles of `rows` rows; returns the tiles of all jobs. */
template <typename P>
static inline int64_t gemv_jobs_fill(P &p, int n_w, const cuda_wdev *w, const int64_t *N, float *const *y, int rows)
{
    int64_t tiles = 0;
    for (int j = 0; j < n_w; j++) {
        p.w[j] = w[j];
        p.N[j] = N[j];
        p.y[j] = y[j];
        p.first_tile[j] = tiles;
        tiles += (N[j] + rows - 1) / rows;
    }
    p.first_tile[n_w] = tiles;
    return tiles;
}

} // namespace

#endif
