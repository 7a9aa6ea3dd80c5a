/* cuda_norm.cu — RMSNorm, and RMSNorm with the residual add fused in.
 *
 * One block per row. The sum of squares is taken in double and the scale
 * computed as the CPU does (1 / sqrtf(float(ss / dim) + eps), then
 * w * (x * inv)), so results match the reference to the last bit unless the
 * double sums round differently (they practically never do).
 */
#include "backend/cuda/common/common.h"
#include "backend/cuda/common/cuda_common.cuh"
#include "backend/cuda/common/cuda_ktrace.cuh"

KT_MODULE(norm, "add_rmsnorm_vec")

namespace
{

__global__ void rmsnorm_kernel(const float *x, const float *w, int dim, float eps, float *y)
{
    pdl_wait_trigger_small();
    const float *xr = x + (size_t)blockIdx.x * (size_t)dim;
    float *yr = y + (size_t)blockIdx.x * (size_t)dim;
    double ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        ss += (double)xr[j] * (double)xr[j];
    float inv = dev_rms_inv(block_sum_double(ss), dim, eps);
    for (int j = threadIdx.x; j < dim;
         j += blockDim.x) /* x == y: each thread rereads only its own elements */
        yr[j] = __fmul_rn(w[j], __fmul_rn(xr[j], inv));
}

__global__ void add_rmsnorm_kernel(float *h, const float *delta, const float *w, int dim, float eps, float *y)
{
    float *hr = h + (size_t)blockIdx.x * (size_t)dim;
    const float *dr = delta + (size_t)blockIdx.x * (size_t)dim;
    float *yr = y + (size_t)blockIdx.x * (size_t)dim;
    double ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = __fadd_rn(hr[j], dr[j]);
        hr[j] = v;
        ss += (double)v * (double)v;
    }
    float inv = dev_rms_inv(block_sum_double(ss), dim, eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        yr[j] = __fmul_rn(w[j], __fmul_rn(hr[j], inv));
}

/* The register form of a model-width row: NV float4s a thread of 256, the weights loaded before
 * pdl_wait() (they do not depend on the previous kernel), the sum of squares in double in
 * ascending order, and y = w * (v * inv). */
template <int NV>
__device__ __forceinline__ void rms_vec_load_w(const float *w, int n4, float4 (&wv)[NV])
{
#pragma unroll
    for (int i = 0; i < NV; i++) {
        int j = threadIdx.x + 256 * i;
        if (j < n4)
            wv[i] = __ldg((const float4 *)w + j);
    }
}

template <int NV>
__device__ __forceinline__ double rms_vec_sumsq(const float4 (&v)[NV], int n4)
{
    double ss = 0;
#pragma unroll
    for (int i = 0; i < NV; i++)
        if ((int)threadIdx.x + 256 * i < n4)
            ss += (double)v[i].x * v[i].x + (double)v[i].y * v[i].y + (double)v[i].z * v[i].z + (double)v[i].w * v[i].w;
    return ss;
}

template <int NV>
__device__ __forceinline__ void rms_vec_store(float4 *yr, const float4 (&wv)[NV], const float4 (&v)[NV], float inv,
                                              int n4)
{
#pragma unroll
    for (int i = 0; i < NV; i++) {
        int j = threadIdx.x + 256 * i;
        if (j < n4)
            yr[j] = make_float4(__fmul_rn(wv[i].x, __fmul_rn(v[i].x, inv)), __fmul_rn(wv[i].y, __fmul_rn(v[i].y, inv)),
                                __fmul_rn(wv[i].z, __fmul_rn(v[i].z, inv)), __fmul_rn(wv[i].w, __fmul_rn(v[i].w, inv)));
    }
}

/* One row of h += delta, y = rmsnorm(h) * w in the register form. Decode runs it on one row
 * between two GEMVs, where the plain kernel's three dependent passes over global memory would be
 * its whole time. */
template <int NV>
__global__ void __launch_bounds__(256)
    add_rmsnorm_vec_kernel(float *h, const float *delta, const float *w, int dim, float eps, float *y)
{
    KT_BEGIN();
    pdl_trigger();
    const int n4 = dim / 4;
    float4 wv[NV], hv[NV];
    rms_vec_load_w<NV>(w, n4, wv);
    pdl_wait();
    KT_MARK(1);
    float4 *hr = (float4 *)(h + (size_t)blockIdx.x * (size_t)dim);
    const float4 *dr = (const float4 *)(delta + (size_t)blockIdx.x * (size_t)dim);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        int j = threadIdx.x + 256 * i;
        if (j < n4) {
            float4 a = hr[j], b = dr[j];
            hv[i] = make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
        }
    }
#pragma unroll
    for (int i = 0; i < NV; i++) {
        int j = threadIdx.x + 256 * i;
        if (j < n4)
            hr[j] = hv[i];
    }
    float inv = dev_rms_inv(block_sum_double(rms_vec_sumsq<NV>(hv, n4)), dim, eps);
    rms_vec_store<NV>((float4 *)(y + (size_t)blockIdx.x * (size_t)dim), wv, hv, inv, n4);
    KT_END(norm, 0);
}

/* y = rmsnorm(x) * w, one row a block in the register form (x == y allowed: the row is read whole
 * before it is written): GLM-5's q_a norm at one token ran the plain kernel's two passes over
 * global memory after its wait, with the next GEMV waiting on it (5.4 us, ncu, H100). */
template <int NV>
__global__ void __launch_bounds__(256) rmsnorm_vec_kernel(const float *x, const float *w, int dim, float eps, float *y)
{
    pdl_trigger();
    const int n4 = dim / 4;
    float4 wv[NV], xv[NV];
    rms_vec_load_w<NV>(w, n4, wv);
    pdl_wait();
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.x * (size_t)dim);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        int j = threadIdx.x + 256 * i;
        if (j < n4)
            xv[i] = xr[j];
    }
    /* block_sum_double's barrier: every read of x is done before y is written */
    float inv = dev_rms_inv(block_sum_double(rms_vec_sumsq<NV>(xv, n4)), dim, eps);
    rms_vec_store<NV>((float4 *)(y + (size_t)blockIdx.x * (size_t)dim), wv, xv, inv, n4);
}

unsigned norm_threads(int dim)
{
    return dim >= 2048 ? 512u : dim >= 512 ? 256u : dim >= 128 ? 128u : 32u;
}

} // namespace

extern "C" cudaError_t cuda_rmsnorm(cudaStream_t stream, const float *x, const float *w, int rows, int dim,
                                    float eps, float *y, int pdl)
{
    if (rows <= 0 || dim <= 0)
        return cudaSuccess;
    /* rows of a model's width (not the per-head norms: 256 threads for a 128-value row) */
    bool vec = dim >= 1024 && dim % 4 == 0 && ((uintptr_t)x | (uintptr_t)w | (uintptr_t)y) % 16 == 0;
    int nv = (dim / 4 + 255) / 256;
    if (vec && nv <= 2)
        return launch_pdl(pdl != 0, rmsnorm_vec_kernel<2>, dim3((unsigned)rows), dim3(256), 0, stream, x, w, dim, eps, y);
    if (vec && nv <= 8)
        return launch_pdl(pdl != 0, rmsnorm_vec_kernel<8>, dim3((unsigned)rows), dim3(256), 0, stream, x, w, dim, eps, y);
    return launch_pdl(pdl != 0, rmsnorm_kernel, dim3((unsigned)rows), dim3(norm_threads(dim)), 0, stream, x, w, dim,
                      eps, y);
}

extern "C" cudaError_t cuda_add_rmsnorm(cudaStream_t stream, float *h, const float *delta, const float *w,
                                        int rows, int dim, float eps, float *y, int pdl)
{
    if (rows <= 0 || dim <= 0)
        return cudaSuccess;
    bool vec = dim % 4 == 0 && ((uintptr_t)h | (uintptr_t)delta | (uintptr_t)w | (uintptr_t)y) % 16 == 0;
    int nv = (dim / 4 + 255) / 256;
    if (vec && nv <= 2)
        return launch_pdl(pdl != 0, add_rmsnorm_vec_kernel<2>, dim3((unsigned)rows), dim3(256), 0, stream, h, delta, w,
                          dim, eps, y);
    if (vec && nv <= 4)
        return launch_pdl(pdl != 0, add_rmsnorm_vec_kernel<4>, dim3((unsigned)rows), dim3(256), 0, stream, h, delta, w,
                          dim, eps, y);
    if (vec && nv <= 8)
        return launch_pdl(pdl != 0, add_rmsnorm_vec_kernel<8>, dim3((unsigned)rows), dim3(256), 0, stream, h, delta, w,
                          dim, eps, y);
    add_rmsnorm_kernel<<<(unsigned)rows, norm_threads(dim), 0, stream>>>(h, delta, w, dim, eps, y);
    return CUDA_LAUNCH_RESULT();
}
