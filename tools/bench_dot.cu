/* bench_dot.cu — what the batch-1 NVFP4 dot product costs per weight layout, one kernel alone.
 *
 * Session 9 found the decode kernels bound by instruction issue, not DRAM: the E2M1 -> bf16 pairs of
 * the decode layout cost two shifts, two LOP3 and one HMUL2 each, and the LOP3s and right shifts go
 * to the 16-lane integer pipe (two issue cycles a warp instruction). This tool measures, on the
 * shapes of Qwen3-30B-A3B's batch-1 linears, the production dot (cuda_decode_mma.cuh: 8 weight rows
 * as the mma's B operand, x as A) against a repacked layout built for the decode only:
 *  - 16 weight rows as the A operand (m16n8k16), x's hi and lo as B's columns 0 and 1: half the
 *    mmas and shared loads a weight;
 *  - each lane's 32-bit word holds exactly its 8 weights of one mma, placed so that three of its
 *    four bf16x2 pairs come out with at most one shift and one LOP3 (a0 in place, a1 and a2 a
 *    left shift of 3 and 6), the fourth with three shifts and three LOP3;
 *  - one mma covers exactly one 16-k scale block of its 16 rows, so the block scale multiplies
 *    the mma's fresh fp32 C (four FFMA) instead of every bf16x2 pair (E4M3 pair -> f16x2 by one
 *    cvt on sm_89 and later).
 * Weights E2M1 at bf16 bits 8..6 are the value times 2^-126 (0.5 is a bf16 subnormal), so mode
 * "c" also checks that the tensor core keeps subnormal inputs; mode "h" first multiplies the
 * pairs by 2^64 (normal numbers; one HMUL2 a pair more).
 * Each variant runs 48 times back to back in a CUDA graph on 48 copies of the weights (nothing in
 * L2, as the 48 layers of a step) and its output is checked against a double-precision reference.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/bench_dot tools/bench_dot.cu && /tmp/bench_dot
 */
/* the production kernels themselves: gemv_mma (the backend's one-token dense linear) is launched
 * through its own launcher */
#include "backend/cuda/cuda_decode_mma.cu"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                                                   \
    do {                                                                                                        \
        cudaError_t e_ = (x);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                  \
            exit(1);                                                                                            \
        }                                                                                                       \
    } while (0)

namespace
{

enum { BD_THREADS = 128, BD_COPIES = 48 };

/* ---- the production scheme (cuda_decode_mma.cuh), as moe_gate_up_mma_kernel uses it ---- */
template <int U>
__global__ void __launch_bounds__(BD_THREADS, 4) v0_kernel(cuda_wdev w, int64_t N, int64_t K, const float *x, float *y)
{
    extern __shared__ uint2 xf[];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t row0 = ((int64_t)blockIdx.x * (BD_THREADS / 32) + warp) * 8, row = row0 + lane / 4;
    const int G = (int)(K / 128);
    chunk16 pre[U];
    rows8_prefetch<U>(w, row, row < N, K, 0, G, pre);
    xfrag_zeros_init();
    xfrag_stage(xf, x, (int)K, threadIdx.x, BD_THREADS);
    __syncthreads();
    const float2 r = rows8_dot_range<U>(w, row, row < N, K, xf, 0, G, pre);
    if (lane < 4 && row0 + 2 * lane + 1 < N) {
        y[row0 + 2 * lane] = r.x * 0x1p62f * w.scale2;
        y[row0 + 2 * lane + 1] = r.y * 0x1p62f * w.scale2;
    }
}

/* ---- the repacked decode layout ----
 * Tile T (rows 16T .. 16T + 15), segment s (k 64s .. 64s + 63): 512 bytes at wq[(T * nseg + s) * 32],
 * lane (g, t)'s 16 bytes at + lane: word j is mma j (the 16-k block 4s + j); its scales at
 * sq[(T * nseg + s) * 8 + g]: byte 2j row g's, byte 2j + 1 row g + 8's. The word's pairs:
 * a0 = row g k (4t, 4t + 1), a1 = row g + 8 the same k, a2 = row g k (4t + 2, 4t + 3), a3 = row g + 8
 * those; x's B fragment uses the same k order (b0: 4t, 4t + 1; b1: 4t + 2, 4t + 3). */
__device__ __forceinline__ void a16_pairs(uint32_t u, uint32_t &a0, uint32_t &a1, uint32_t &a2, uint32_t &a3)
{
    constexpr uint32_t M = 0x81C081C0u;
    a0 = u & M;
    a1 = (u << 3) & M;
    a2 = (u << 6) & M;
    a3 = ((u >> 4) & 0x00C000C0u) | ((u >> 6) & 0x01000100u) | ((u << 2) & 0x80008000u);
}

__device__ __forceinline__ void mma_a16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint2 b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y), "f"(0.0f));
}

__device__ __forceinline__ float2 e4m3x2_f32(uint32_t s16)
{
    uint32_t h;
    asm("{.reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e4m3x2 %0, t;}" : "=r"(h) : "r"(s16));
    __half2 v;
    memcpy(&v, &h, 4);
    return __half22float2(v);
}

/* MODE 0: scale on C, subnormal weights into the mma; 1: pairs times 2^64 first; 2: read only. */
template <int U, int KS, int MODE>
__global__ void __launch_bounds__(BD_THREADS) a16_kernel(const uint4 *wq, const uint2 *sq, int64_t N, int64_t K,
                                                          const float *x, float *y, float fs, unsigned *sink)
{
    extern __shared__ uint2 xb[]; /* [K / 16 blocks][16]: see the staging below */
    __shared__ float4 part[BD_THREADS / 32][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int nseg = (int)(K / 64);
    const int64_t tile = (int64_t)blockIdx.x * (BD_THREADS / 32 / KS) + warp / KS;
    const int ks = warp % KS, s0 = ks * nseg / KS, s1 = (ks + 1) * nseg / KS;
    const bool ok = tile * 16 < N;
    const uint4 *wp = wq + (size_t)tile * nseg * 32 + lane;
    const uint2 *sp = sq + (size_t)tile * nseg * 8 + g;
    uint4 wv[U];
    uint2 sv[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (ok && s0 + u < s1) {
            wv[u] = __ldg(wp + (size_t)(s0 + u) * 32);
            sv[u] = __ldg(sp + (size_t)(s0 + u) * 8);
        }
    /* x * 2^XS as bf16 hi + lo: products of the 2^-126-scaled weights stay normal in fp32. Block b's
     * 16 uint2: [0, 4) hi for t = 0..3 (B column 0), [4, 8) lo (column 1), [8, 12) zeros for the
     * lanes of columns 2..7 (one wavefront: x in banks 0-15, the zeros in 16-23). Each thread's
     * loads are issued before its first store: each is an L2 round trip. */
    const float xs = MODE == 1 ? 0x1p-64f * 0x1p100f : 0x1p100f;
    constexpr int XB = 4;
    for (int i0 = threadIdx.x; i0 < (int)(K / 4); i0 += XB * BD_THREADS) {
        float4 xv[XB];
#pragma unroll
        for (int q = 0; q < XB; q++)
            if (i0 + q * BD_THREADS < (int)(K / 4))
                xv[q] = *(const float4 *)(x + 4 * (i0 + q * BD_THREADS));
#pragma unroll
        for (int q = 0; q < XB; q++) {
            const int i = i0 + q * BD_THREADS;
            if (i >= (int)(K / 4))
                break;
            const int b = i / 4, tt = i % 4;
            const float v0 = xv[q].x * xs, v1 = xv[q].y * xs, v2 = xv[q].z * xs, v3 = xv[q].w * xs;
            const float h0 = bf16_round(v0), h1 = bf16_round(v1), h2 = bf16_round(v2), h3 = bf16_round(v3);
            xb[b * 16 + tt] = make_uint2(bf16x2_of(h0, h1), bf16x2_of(h2, h3));
            xb[b * 16 + 4 + tt] = make_uint2(bf16x2_of(v0 - h0, v1 - h1), bf16x2_of(v2 - h2, v3 - h3));
            xb[b * 16 + 8 + tt] = make_uint2(0u, 0u);
        }
    }
    __syncthreads();
    const uint2 *xl = xb + (g == 0 ? t : g == 1 ? 4 + t : 8 + t);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    unsigned xr = 0;
    for (int s = s0; s < s1; s += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (s + u >= s1)
                break;
            const uint32_t words[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
            if constexpr (MODE == 2) {
                xr ^= words[0] ^ words[1] ^ words[2] ^ words[3] ^ sv[u].x ^ sv[u].y;
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t a0, a1, a2, a3;
                    a16_pairs(words[j], a0, a1, a2, a3);
                    if constexpr (MODE == 1) {
                        a0 = bf16x2_fma(a0, 0x5F805F80u, 0x80008000u); /* x 2^64 */
                        a1 = bf16x2_fma(a1, 0x5F805F80u, 0x80008000u);
                        a2 = bf16x2_fma(a2, 0x5F805F80u, 0x80008000u);
                        a3 = bf16x2_fma(a3, 0x5F805F80u, 0x80008000u);
                    }
                    const uint2 bx = xl[(4 * s + 4 * u + j) * 16];
                    float c[4];
                    mma_a16(c, a0, a1, a2, a3, bx);
                    const uint32_t sw = j < 2 ? sv[u].x : sv[u].y;
                    const float2 sc = e4m3x2_f32(j % 2 ? sw >> 16 : sw & 0xffffu);
                    acc[0] = fmaf(c[0], sc.x, acc[0]);
                    acc[1] = fmaf(c[1], sc.x, acc[1]);
                    acc[2] = fmaf(c[2], sc.y, acc[2]);
                    acc[3] = fmaf(c[3], sc.y, acc[3]);
                }
            }
            if (ok && s + u + U < s1) {
                wv[u] = __ldg(wp + (size_t)(s + u + U) * 32);
                sv[u] = __ldg(sp + (size_t)(s + u + U) * 8);
            }
        }
    }
    if constexpr (MODE == 2) {
        if (xr == 0x12345678u)
            atomicAdd(sink, 1u);
        return;
    }
    if constexpr (KS > 1) {
        part[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        __syncthreads();
        if (ks != 0)
            return;
        for (int k = 1; k < KS; k++) {
            const float4 p = part[warp + k][lane];
            acc[0] += p.x;
            acc[1] += p.y;
            acc[2] += p.z;
            acc[3] += p.w;
        }
    }
    if (ok && t == 0) {
        y[tile * 16 + g] = (acc[0] + acc[1]) * fs;
        y[tile * 16 + g + 8] = (acc[2] + acc[3]) * fs;
    }
}

/* ---- host ---- */
float e2m1_host(unsigned c)
{
    static const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    return (c & 8u) ? -mag[c & 7u] : mag[c & 7u];
}

unsigned nib(const std::vector<uint8_t> &q, int64_t K, int64_t r, int64_t k)
{
    const uint8_t b = q[(size_t)(r * (K / 2) + k / 2)];
    return k % 2 ? b >> 4 : b & 15u;
}

/* bit positions (m, e0, e1, s) of the lo and hi weight of pair a0..a3 in a lane's word */
const int kPos[4][2][4] = {
    {{6, 7, 8, 15}, {22, 23, 24, 31}},
    {{3, 4, 5, 12}, {19, 20, 21, 28}},
    {{0, 1, 2, 9}, {16, 17, 18, 25}},
    {{10, 11, 14, 13}, {26, 27, 30, 29}},
};

uint32_t put_code(uint32_t w, const int (&pos)[4], unsigned c)
{
    for (int b = 0; b < 4; b++)
        if (c >> b & 1u)
            w |= 1u << pos[b];
    return w;
}

void repack(const std::vector<uint8_t> &q, const std::vector<uint8_t> &sc, int64_t N, int64_t K,
            std::vector<uint32_t> &wq, std::vector<uint8_t> &sq)
{
    const int64_t tiles = N / 16, nseg = K / 64;
    wq.assign((size_t)(tiles * nseg * 32 * 4), 0u);
    sq.assign((size_t)(tiles * nseg * 64), 0u);
    for (int64_t T = 0; T < tiles; T++)
        for (int64_t s = 0; s < nseg; s++)
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane / 4, t = lane % 4;
                for (int j = 0; j < 4; j++) {
                    const int64_t kb = 64 * s + 16 * j + 4 * t;
                    const int64_t rg = 16 * T + g, r8 = rg + 8;
                    uint32_t w = 0;
                    const int64_t rows[4] = {rg, r8, rg, r8};
                    const int64_t ks[4] = {kb, kb, kb + 2, kb + 2};
                    for (int p = 0; p < 4; p++) {
                        w = put_code(w, kPos[p][0], nib(q, K, rows[p], ks[p]));
                        w = put_code(w, kPos[p][1], nib(q, K, rows[p], ks[p] + 1));
                    }
                    wq[(size_t)(((T * nseg + s) * 32 + lane) * 4 + j)] = w;
                }
            }
    for (int64_t T = 0; T < tiles; T++)
        for (int64_t s = 0; s < nseg; s++)
            for (int g = 0; g < 8; g++)
                for (int j = 0; j < 4; j++) {
                    const int64_t b = 4 * s + j;
                    uint8_t *o = &sq[(size_t)((T * nseg + s) * 64 + g * 8 + 2 * j)];
                    o[0] = sc[(size_t)((16 * T + g) * (K / 16) + b)];
                    o[1] = sc[(size_t)((16 * T + g + 8) * (K / 16) + b)];
                }
}

struct shape {
    const char *name;
    int64_t N, K;
};

struct variant {
    const char *name;
    int kind; /* 0: v0, 1: a16, 2: cuda_gemv_mma */
    void *fn;
    int ks;
    int mode;
};

} // namespace

int main(int argc, char **argv)
{
    const shape shapes[] = {
        {"gate/up 8 experts", 12288, 2048}, {"down 8 experts", 16384, 768}, {"q/k/v", 5120, 2048}, {"o", 2048, 4096}};
    const variant vars[] = {
        {"prod gemv_mma (K slices)", 2, nullptr, 1, 0},
        {"prod (8 rows as B, U=8)", 0, (void *)v0_kernel<8>, 1, 0},
        {"prod (8 rows as B, U=4)", 0, (void *)v0_kernel<4>, 1, 0},
        {"a16 c U4 KS1", 1, (void *)a16_kernel<4, 1, 0>, 1, 0},
        {"a16 c U4 KS2", 1, (void *)a16_kernel<4, 2, 0>, 2, 0},
        {"a16 c U4 KS4", 1, (void *)a16_kernel<4, 4, 0>, 4, 0},
        {"a16 c U2 KS4", 1, (void *)a16_kernel<2, 4, 0>, 4, 0},
        {"a16 c U8 KS2", 1, (void *)a16_kernel<8, 2, 0>, 2, 0},
        {"a16 h U4 KS2", 1, (void *)a16_kernel<4, 2, 1>, 2, 1},
        {"a16 h U4 KS4", 1, (void *)a16_kernel<4, 4, 1>, 4, 1},
        {"a16 read only U4 KS2", 1, (void *)a16_kernel<4, 2, 2>, 2, 2},
        {"a16 read only U4 KS4", 1, (void *)a16_kernel<4, 4, 2>, 4, 2},
    };
    const int only = argc > 1 ? atoi(argv[1]) : -1;
    std::mt19937 rng(1234);
    unsigned *sink;
    CK(cudaMalloc(&sink, 4));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("%-22s %-26s %10s %10s %12s\n", "shape", "variant", "us/launch", "GB/s", "max rel err");
    for (int si = 0; si < 4; si++) {
        if (only >= 0 && si != only)
            continue;
        const shape &S = shapes[si];
        const int64_t N = S.N, K = S.K;
        std::vector<uint8_t> q((size_t)(N * K / 2)), sc((size_t)(N * K / 16));
        for (auto &b : q)
            b = (uint8_t)(rng() & 0xffu);
        /* E4M3 scales from 2^-9 (subnormal) to ~2: the range NVFP4 checkpoints use, every code valid */
        for (auto &b : sc) {
            const unsigned e = rng() % 9u, m = rng() % 8u; /* exponent field 0 .. 8 */
            b = (uint8_t)(e << 3 | m);
        }
        std::vector<float> x((size_t)K);
        std::normal_distribution<float> nd(0.f, 1.f);
        for (auto &v : x)
            v = nd(rng);
        const float gs = 0.0123f;
        std::vector<double> ref((size_t)N);
        double refmax = 0;
        for (int64_t r = 0; r < N; r++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)e2m1_host(nib(q, K, r, k)) * e4m3_value(sc[(size_t)(r * (K / 16) + k / 16)]) * x[(size_t)k];
            ref[(size_t)r] = acc * gs;
            refmax = fmax(refmax, fabs(ref[(size_t)r]));
        }
        std::vector<uint32_t> wq;
        std::vector<uint8_t> sq;
        repack(q, sc, N, K, wq, sq);
        const size_t wbytes = q.size(), sbytes = sc.size();
        std::vector<void *> dq(BD_COPIES), ds(BD_COPIES), dwq(BD_COPIES), dsq(BD_COPIES);
        for (int c = 0; c < BD_COPIES; c++) {
            CK(cudaMalloc(&dq[c], wbytes));
            CK(cudaMalloc(&ds[c], sbytes));
            CK(cudaMalloc(&dwq[c], wbytes));
            CK(cudaMalloc(&dsq[c], sbytes));
            CK(cudaMemcpy(dq[c], q.data(), wbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(ds[c], sc.data(), sbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dwq[c], wq.data(), wbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dsq[c], sq.data(), sbytes, cudaMemcpyHostToDevice));
        }
        float *dx, *dy;
        CK(cudaMalloc(&dx, K * 4));
        CK(cudaMalloc(&dy, N * 4));
        CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
        for (const variant &V : vars) {
            if (V.kind == 1 && (N % 16 != 0 || K % (64 * V.ks) != 0))
                continue;
            auto launch = [&](int c) {
                if (V.kind == 2) {
                    cuda_wdev w = {dq[c], ds[c], nullptr, gs};
                    float *py = dy;
                    CK(cuda_gemv_mma(st, 1, &w, &N, K, dx, 1, &py, nullptr, sms, 0));
                } else if (V.kind == 0) {
                    cuda_wdev w = {dq[c], ds[c], nullptr, gs};
                    const unsigned blocks = (unsigned)((N + 31) / 32);
                    int64_t n = N, k = K;
                    const float *px = dx;
                    float *py = dy;
                    void *args[] = {&w, &n, &k, &px, &py};
                    CK(cudaLaunchKernel(V.fn, dim3(blocks), dim3(BD_THREADS), args, (size_t)(K * 4), st));
                } else {
                    const unsigned blocks = (unsigned)(N / 16 * V.ks / (BD_THREADS / 32));
                    const float fs = gs * (V.mode == 1 ? 0x1p-36f * 0x1p62f : 0x1p26f);
                    const uint4 *pw = (const uint4 *)dwq[c];
                    const uint2 *ps = (const uint2 *)dsq[c];
                    int64_t n = N, k = K;
                    const float *px = dx;
                    float *py = dy;
                    float f = fs;
                    unsigned *pk = sink;
                    void *args[] = {&pw, &ps, &n, &k, &px, &py, &f, &pk};
                    CK(cudaLaunchKernel(V.fn, dim3(blocks), dim3(BD_THREADS), args, (size_t)(K / 16 * 16 * 8), st));
                }
            };
            if (V.fn)
                CK(cudaFuncSetAttribute(V.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
            CK(cudaMemset(dy, 0, N * 4));
            launch(0);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            std::vector<float> y((size_t)N);
            CK(cudaMemcpy(y.data(), dy, N * 4, cudaMemcpyDeviceToHost));
            double err = 0;
            for (int64_t r = 0; r < N; r++)
                err = fmax(err, fabs((double)y[(size_t)r] - ref[(size_t)r]));
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int c = 0; c < BD_COPIES; c++)
                launch(c);
            CK(cudaStreamEndCapture(st, &graph));
            CK(cudaGraphInstantiate(&exec, graph, 0));
            CK(cudaGraphLaunch(exec, st));
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            const int reps = 10;
            CK(cudaEventRecord(e0, st));
            for (int i = 0; i < reps; i++)
                CK(cudaGraphLaunch(exec, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double us = ms * 1e3 / (reps * BD_COPIES);
            if (V.mode == 2)
                printf("%-22s %-26s %10.2f %10.1f %12s\n", S.name, V.name, us, (wbytes + sbytes) / us / 1e3, "-");
            else
                printf("%-22s %-26s %10.2f %10.1f %12.3g\n", S.name, V.name, us, (wbytes + sbytes) / us / 1e3,
                       err / refmax);
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
        for (int c = 0; c < BD_COPIES; c++) {
            cudaFree(dq[c]);
            cudaFree(ds[c]);
            cudaFree(dwq[c]);
            cudaFree(dsq[c]);
        }
        cudaFree(dx);
        cudaFree(dy);
    }
    return 0;
}
