/* bench_dot.cu — what the batch-1 NVFP4 dot product costs per weight layout, one kernel alone.
 *
 * Session 9 found the decode kernels bound by instruction issue, not DRAM: the E2M1 -> bf16 pairs of
 * the checkpoint layout cost two shifts, two LOP3 and one HMUL2 each, and the LOP3s and right
 * shifts go to the 16-lane integer pipe. This tool measures, on the shapes of Qwen3-30B-A3B's
 * batch-1 linears, the production dots (cuda_decode_mma.cu: 8 weight rows as the mma's B operand,
 * x as A; the MoE kernels' whole-K warps and gemv_mma's K slices) against the dec16 layout of
 * cuda_dec16.cu (16 rows as the A operand, a lane's word holding its 8 weights of one mma, three
 * of four bf16x2 pairs by at most one shift and one LOP3, the block scale on a fresh C): its
 * production GEMV and this file's variants of it (K split, segments in flight, read only).
 * Each variant runs 48 times back to back in a CUDA graph on 48 copies of the weights (nothing in
 * L2, as the 48 layers of a step; no PDL) and its output is checked against a double-precision
 * reference. The dec16 copies are made by the production packer (cuda_dec16_pack).
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/bench_dot tools/bench_dot.cu && /tmp/bench_dot
 *
 * H200, session 10 (us a launch): gate/up shape (12288 x 2048) production 9.92, dec16 KS2 8.30;
 * down (16384 x 768) 6.59 / 5.74; q/k/v (5120 x 2048) gemv_mma 8.75 / dec16 KS4 5.80; o (2048 x
 * 4096) gemv_mma 7.43 / 6.92. In a decode step the dense win vanishes (gemv_mma's weights are all
 * loaded before its PDL wait); the MoE gate/up's shows as +1.4% (MOESERVE_DEC16_MOE=1).
 */
/* the production kernels themselves, launched through their own launchers */
#include "backend/cuda/cuda_dec16.cu"
#include "backend/cuda/decode/cuda_decode_mma.cu"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench_ck.cuh"

namespace
{

enum { BD_THREADS = 128, BD_COPIES = 48 };

/* ---- the production scheme (cuda_decode_mma.cuh), as moe_gate_up_mma_kernel uses it ---- */
template <int U>
__global__ void __launch_bounds__(BD_THREADS, 4)
    v0_kernel(cuda_wdev w, int64_t N, int64_t K, const float *x, float *y)
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

/* ---- dec16 variants (cuda_dec16.cu's pieces): K split KS, U segments in flight, READ_ONLY:
 * the same loads and no arithmetic (the layout's streaming floor) ---- */
template <int U, int KS, bool READ_ONLY>
__global__ void __launch_bounds__(DQ_THREADS)
    a16_kernel(const uint4 *wq, const uint2 *sq, int64_t N, int64_t K, const float *x, float *y, float fs,
               unsigned *sink)
{
    extern __shared__ uint2 xb[];
    __shared__ float4 part[DQ_WARPS][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int nseg = (int)(K / 64);
    const int64_t tile = (int64_t)blockIdx.x * (DQ_WARPS / KS) + warp / KS;
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
    dec16_stage_x(xb, x, (int)K, [] {});
    __syncthreads();
    const uint2 *xl = xb + (g == 0 ? t : g == 1 ? 4 + t : 8 + t);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    unsigned xr = 0;
    for (int s = s0; s < s1; s += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (s + u >= s1)
                break;
            if constexpr (READ_ONLY)
                xr ^= wv[u].x ^ wv[u].y ^ wv[u].z ^ wv[u].w ^ sv[u].x ^ sv[u].y;
            else
                dec16_segment(wv[u], sv[u], xl + (size_t)(s + u) * 64, acc);
            if (ok && s + u + U < s1) {
                wv[u] = __ldg(wp + (size_t)(s + u + U) * 32);
                sv[u] = __ldg(sp + (size_t)(s + u + U) * 8);
            }
        }
    }
    if constexpr (READ_ONLY) {
        if (xr == 0x12345678u)
            atomicAdd(sink, 1u);
        return;
    }
    part[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (!ok || ks != 0 || t != 0)
        return;
    for (int k = 1; k < KS; k++) {
        const float4 p = part[warp + k][lane];
        acc[0] += p.x, acc[1] += p.y, acc[2] += p.z, acc[3] += p.w;
    }
    y[tile * 16 + g] = (acc[0] + acc[1]) * fs;
    y[tile * 16 + g + 8] = (acc[2] + acc[3]) * fs;
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

struct shape {
    const char *name;
    int64_t N, K;
};

struct variant {
    const char *name;
    int kind; /* 0: v0, 1: a16, 2: cuda_gemv_mma, 3: cuda_dec16_gemv */
    void *fn;
    int ks;
    int mode; /* 2: read only */
};

} // namespace

int main(int argc, char **argv)
{
    const shape shapes[] = {{"gate/up 8 experts", 12288, 2048},
                            {"down 8 experts", 16384, 768},
                            {"q/k/v", 5120, 2048},
                            {"o", 2048, 4096}};
    const variant vars[] = {
        {"prod gemv_mma (K slices)", 2, nullptr, 1, 0},
        {"prod (8 rows as B, U=8)", 0, (void *)v0_kernel<8>, 1, 0},
        {"prod (8 rows as B, U=4)", 0, (void *)v0_kernel<4>, 1, 0},
        {"dec16 gemv (production)", 3, nullptr, 1, 0},
        {"dec16 U4 KS1", 1, (void *)a16_kernel<4, 1, false>, 1, 0},
        {"dec16 U4 KS2", 1, (void *)a16_kernel<4, 2, false>, 2, 0},
        {"dec16 U4 KS4", 1, (void *)a16_kernel<4, 4, false>, 4, 0},
        {"dec16 U8 KS2", 1, (void *)a16_kernel<8, 2, false>, 2, 0},
        {"dec16 U8 KS4", 1, (void *)a16_kernel<8, 4, false>, 4, 0},
        {"dec16 read only U4 KS2", 1, (void *)a16_kernel<4, 2, true>, 2, 2},
        {"dec16 read only U4 KS4", 1, (void *)a16_kernel<4, 4, true>, 4, 2},
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
                acc += (double)e2m1_host(nib(q, K, r, k)) * e4m3_value(sc[(size_t)(r * (K / 16) + k / 16)]) *
                       x[(size_t)k];
            ref[(size_t)r] = acc * gs;
            refmax = fmax(refmax, fabs(ref[(size_t)r]));
        }
        const size_t wbytes = q.size(), sbytes = sc.size();
        std::vector<void *> dq(BD_COPIES), ds(BD_COPIES), dwq(BD_COPIES), dsq(BD_COPIES);
        for (int c = 0; c < BD_COPIES; c++) {
            CK(cudaMalloc(&dq[c], wbytes));
            CK(cudaMalloc(&ds[c], sbytes));
            CK(cudaMalloc(&dwq[c], wbytes));
            CK(cudaMalloc(&dsq[c], sbytes));
            CK(cudaMemcpy(dq[c], q.data(), wbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(ds[c], sc.data(), sbytes, cudaMemcpyHostToDevice));
            const cuda_wdev src = {dq[c], ds[c], nullptr, 1.0f};
            CK(cuda_dec16_pack(st, &src, N, K, dwq[c], dsq[c])); /* the production packer */
        }
        float *dx, *dy;
        CK(cudaMalloc(&dx, K * 4));
        CK(cudaMalloc(&dy, N * 4));
        CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
        for (const variant &V : vars) {
            if (V.kind == 1 && (N % 16 != 0 || K % (64 * V.ks) != 0))
                continue;
            auto launch = [&](int c) {
                if (V.kind == 3) {
                    cuda_wdev w = {dwq[c], dsq[c], nullptr, gs};
                    float *py = dy;
                    CK(cuda_dec16_gemv(st, 1, &w, &N, K, dx, &py, sms, 0));
                } else if (V.kind == 2) {
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
                    const unsigned blocks = (unsigned)(N / 16 * V.ks / DQ_WARPS);
                    const float fs = gs * 0x1p26f;
                    const uint4 *pw = (const uint4 *)dwq[c];
                    const uint2 *ps = (const uint2 *)dsq[c];
                    int64_t n = N, k = K;
                    const float *px = dx;
                    float *py = dy;
                    float f = fs;
                    unsigned *pk = sink;
                    void *args[] = {&pw, &ps, &n, &k, &px, &py, &f, &pk};
                    CK(cudaLaunchKernel(V.fn, dim3(blocks), dim3(DQ_THREADS), args, (size_t)(K / 16 * 16 * 8),
                                        st));
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
                printf("%-22s %-26s %10.2f %10.1f %12s\n", S.name, V.name, us, (wbytes + sbytes) / us / 1e3,
                       "-");
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
