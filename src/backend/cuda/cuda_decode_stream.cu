/* cuda_decode_stream.cu — one-token decode kernels that stream their weights through shared
 * memory in one wave.
 *
 * The register kernels of cuda_decode.cu launch a block per few rows: 1.2 to 2 waves on an
 * H200, each block a chain of dependent memory trips, and the next kernel cannot start its
 * loads until this one ends (PDL made them slower: its early blocks took the slots of the
 * second wave). Here every kernel is exactly one block per SM and cuts its rows evenly across
 * the blocks. A block copies its rows' weight bytes into shared memory with cp.async *before*
 * it waits for the previous kernel (programmatic dependent launch): weights never depend on
 * activations, so with PDL the next op's weights stream in while this op still runs. The one
 * exception is gate/up, whose experts are known only after routing.
 *
 * Work of a block: "local rows" (one weight row each, K long); a unit is two rows and one K
 * slice. Warp w owns units w, w + 16, ...: it issues all their copies first (a cp.async group
 * each), then computes each unit as soon as its own group has landed (no block-wide wait
 * between copies and arithmetic), each lane a 16-byte chunk at a time against x (staged once
 * per block in the swizzled layout of cuda_decode_common.cuh). Partial sums land in shared
 * memory and one thread per output adds the slices in a fixed order: results do not depend on
 * timing. Everything a block needs must fit its shared-memory share; shapes that do not fit
 * are left to cuda_decode.cu.
 *
 * Kernels (NVFP4, BF16 and F16 weights; one token):
 *  - dense: y_j = x W_j^T for up to 3 weights (q, k, v), optionally x = rmsnorm(residual) * w
 *    in the prologue (every block normalises the row itself) and y += in the epilogue;
 *  - gate_up: act_j = silu(x G_e^T) * (x U_e^T) for the token's slots j (e = ids[j]);
 *  - down: out = sum over slots in ascending expert id of w_j * (act_j D_e^T) (+= out).
 *
 * Status (H200, session 4): correct (op tests, golden fixtures) but SLOWER than cuda_decode.cu,
 * so off by default (MOESERVE_STREAM=1|dense|moe): batch 1 236 tok/s against 328. ncu with the
 * weights already in L2 still gives 8-21 us per kernel at ~0.6 issued warps per scheduler: the
 * kernels are instruction-bound (a unit's bookkeeping, 16 warps per SM to hide LDS latency, the
 * 4 integer ops + 1 FMA per NVFP4 weight), so hiding DRAM latency buys nothing yet.
 *
 * PDL order (each kernel is safe whether or not it was launched with PDL): dense and down
 * trigger their dependents at once; gate/up only after its wait, so that down, started early,
 * can already read the routing's ids (written two kernels before it) to fetch its experts.
 */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_decode_common.cuh"

namespace
{

enum { ST_THREADS = 512, ST_WARPS = ST_THREADS / 32, ST_MAX_JOBS = 3, ST_MAX_USED = 32 };
enum { KIND_DENSE = 0, KIND_GATE_UP = 1, KIND_DOWN = 2 };

struct st_params {
    int kind;
    int K;              /* row length of every weight */
    int T;              /* rows cut across the blocks: dense sum N_j, gate/up n_used I, down D */
    /* dense */
    int n_jobs;
    cuda_wdev w[ST_MAX_JOBS];
    int first[ST_MAX_JOBS + 1]; /* row offsets of the jobs, first[n_jobs] = T */
    float *y[ST_MAX_JOBS];
    const float *x;     /* dense, gate/up: the token's row; down: act (n_used rows of I) */
    const float *norm_w;
    float eps;
    float *x_out;
    int residual;
    /* MoE */
    const cuda_wdev *table; /* gate[n_experts], up[...], down[...] */
    int n_experts, n_used;
    int I;
    const int32_t *ids;
    const float *weights;
    float *out;         /* gate/up: act; down: the token's output row */
    /* layout */
    int ks;             /* K slices per row */
    int row_bytes;      /* weight bytes of a row in shared memory (16-byte multiple) */
    int scale_bytes;
    int x_floats;       /* staged x */
    int max_rows;       /* local rows of the largest block */
};

/* The block's share of the T rows: [v0, v1). */
__device__ __forceinline__ void block_range(int T, int &v0, int &v1)
{
    v0 = (int)((int64_t)T * blockIdx.x / gridDim.x);
    v1 = (int)((int64_t)T * (blockIdx.x + 1) / gridDim.x);
}

/* Local row i of the block: its weight, the row in it, and the slot (down) / job it serves.
 * Returns false for a row that does not exist (padding, or an expert id out of range). The MoE
 * kinds find their weights in s_w (gate, up, down entries of the block's slots, in shared
 * memory: one table trip for the block, not one per row). */
struct row_ref {
    const cuda_wdev *w;
    int n;
};

__device__ __forceinline__ bool local_row(const st_params &p, const int *s_e, const cuda_wdev *s_w, int v0, int nv,
                                          int nd2, int i, row_ref &r)
{
    if (p.kind == KIND_DENSE) {
        if (i >= nv)
            return false;
        const int v = v0 + i;
        int j = 0;
        while (j + 1 < p.n_jobs && v >= p.first[j + 1])
            j++;
        r.w = &p.w[j];
        r.n = v - p.first[j];
        return true;
    }
    if (p.kind == KIND_GATE_UP) {
        if (i >= 2 * nv)
            return false;
        const int v = v0 + i / 2;
        const int pair = v / p.I, e = s_e[pair];
        if (e < 0 || e >= p.n_experts)
            return false;
        r.w = &s_w[(i % 2) * ST_MAX_USED + pair];
        r.n = v % p.I;
        return true;
    }
    const int j = i / nd2, dl = i % nd2;
    if (j >= p.n_used || dl >= nv)
        return false;
    const int e = s_e[j];
    if (e < 0 || e >= p.n_experts)
        return false;
    r.w = &s_w[2 * ST_MAX_USED + j];
    r.n = v0 + dl;
    return true;
}

/* Shared-memory bytes of one unit (two rows' slice of weights, then their scales). */
__host__ __device__ __forceinline__ int unit_bytes(const st_params &p)
{
    return 2 * (p.row_bytes + p.scale_bytes) / p.ks;
}

/* cp.async of unit u's slice of rows a, a + 1 into ub (a warp; rows that do not exist are
 * skipped), committed as one group of this warp's lanes. */
template <int FMT>
__device__ __forceinline__ void issue_unit(const st_params &p, const int *s_e, const cuda_wdev *s_w, int v0, int nv,
                                           int nd2, int a, int s, uint8_t *ub)
{
    const int lane = threadIdx.x % 32;
    const int slice = p.row_bytes / p.ks, sslice = p.scale_bytes / p.ks;
    const int dpieces = slice / 16, per_row = dpieces + sslice / 16;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        row_ref r;
        if (local_row(p, s_e, s_w, v0, nv, nd2, a + h, r)) {
            const uint8_t *src = (const uint8_t *)r.w->data + (size_t)r.n * p.row_bytes + (size_t)s * slice;
            const uint8_t *ssrc = (const uint8_t *)r.w->scale + (size_t)r.n * p.scale_bytes + (size_t)s * sslice;
            for (int k = lane; k < per_row; k += 32) {
                if (k < dpieces)
                    cp_async16(ub + h * slice + k * 16, src + k * 16);
                else
                    cp_async16(ub + 2 * slice + h * sslice + (k - dpieces) * 16, ssrc + (k - dpieces) * 16);
            }
        }
    }
    cp_async_commit();
}

/* The dot products of one unit from its buffer ub: rows a, a + 1 (b_live: a + 1 exists), K slice
 * s, x at xs (swizzled); partial sums to res[row * ks + s]. */
template <int FMT>
__device__ __forceinline__ void unit_dot(const st_params &p, const uint8_t *ub, bool b_live, int s, const float4 *xs,
                                         float *res, int row)
{
    constexpr int C = chunk<FMT>::n, Q = chunk<FMT>::q;
    const int lane = threadIdx.x % 32;
    const int NC = p.K / C, CS = NC / p.ks;
    const int slice = p.row_bytes / p.ks, sslice = p.scale_bytes / p.ks;
    float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll 1
    for (int cl = lane; cl < CS; cl += 32) {
        const int c = s * CS + cl;
        const float4 *xc = xs + c * Q;
        const int swz = x_swz<Q>(c);
        wraw w0, w1;
        w0.w = *(const uint4 *)(ub + cl * 16);
        w0.s = FMT == WEIGHT_NVFP4 ? *(const uint16_t *)(ub + 2 * slice + cl * 2) : 0u;
        acc0 += dot_raw<FMT>(w0, xc, swz);
        if (b_live) {
            w1.w = *(const uint4 *)(ub + slice + cl * 16);
            w1.s = FMT == WEIGHT_NVFP4 ? *(const uint16_t *)(ub + 2 * slice + sslice + cl * 2) : 0u;
            acc1 += dot_raw<FMT>(w1, xc, swz);
        }
    }
    acc0 = warp_sum(acc0);
    acc1 = warp_sum(acc1);
    if (lane == 0) {
        res[row * p.ks + s] = acc0;
        if (b_live)
            res[(row + 1) * p.ks + s] = acc1;
    }
}

__device__ __forceinline__ float res_sum(const float *res, int row, int ks)
{
    float v = res[row * ks];
    for (int s = 1; s < ks; s++)
        v += res[row * ks + s];
    return v;
}

template <int FMT>
__global__ void __launch_bounds__(ST_THREADS, 2) stream_kernel(const __grid_constant__ st_params p)
{
    extern __shared__ float4 smem[];
    __shared__ int s_e[ST_MAX_USED];
    __shared__ int s_order[ST_MAX_USED];
    __shared__ cuda_wdev s_w[3 * ST_MAX_USED];
    __shared__ float s_wt[ST_MAX_USED];
    float4 *xs = smem;
    float *res = (float *)(xs + p.x_floats / 4);
    uint8_t *ubase = (uint8_t *)(res + (p.max_rows * p.ks + 3) / 4 * 4);
    int v0, v1;
    block_range(p.T, v0, v1);
    const int nv = v1 - v0, nd2 = (nv + 1) / 2 * 2;
    const int nr = p.kind == KIND_DENSE ? nv : p.kind == KIND_GATE_UP ? 2 * nv : p.n_used * nd2;
    const int units = (nr + 1) / 2 * p.ks, warp = threadIdx.x / 32, ub_bytes = unit_bytes(p);

    if (p.kind != KIND_DENSE) {
        if (p.kind == KIND_GATE_UP)
            pdl_wait(); /* the ids come from the routing kernel just before */
        /* down: the routing kernel ended before gate/up triggered this launch (see top) */
        if (threadIdx.x < p.n_used) {
            s_e[threadIdx.x] = __ldcg(p.ids + threadIdx.x);
            if (p.kind == KIND_DOWN)
                s_wt[threadIdx.x] = __ldcg(p.weights + threadIdx.x);
        }
        __syncthreads();
        if (threadIdx.x < 3 * p.n_used) {
            const int m = threadIdx.x / p.n_used, j = threadIdx.x % p.n_used, e = s_e[j];
            if (e >= 0 && e < p.n_experts)
                s_w[m * ST_MAX_USED + j] = p.table[m * p.n_experts + e];
        }
        __syncthreads();
    }
    /* this warp's units, every load in flight at once: a group each */
    int mine = 0;
    for (int u = warp; u < units; u += ST_WARPS, mine++)
        issue_unit<FMT>(p, s_e, s_w, v0, nv, nd2, 2 * (u / p.ks), u % p.ks, ubase + (size_t)u * ub_bytes);
    pdl_trigger(); /* gate/up: only now, after its wait (see top) */
    if (p.kind != KIND_GATE_UP)
        pdl_wait();

    if (p.kind == KIND_DOWN) {
        /* every slot's activations in one pass (one trip, not one per slot), each slot in the
         * swizzled layout of its own */
        constexpr int Q = chunk<FMT>::q;
        const int per = p.I / 4;
        for (int f = threadIdx.x; f < p.n_used * per; f += ST_THREADS) {
            const int j = f / per, fi = f % per, c = fi / Q;
            float4 v = ((const float4 *)p.x)[f];
            if constexpr (FMT == WEIGHT_NVFP4)
                v = make_float4(v.x * X_PRESCALE, v.y * X_PRESCALE, v.z * X_PRESCALE, v.w * X_PRESCALE);
            xs[j * per + c * Q + ((fi % Q) ^ x_swz<Q>(c))] = v;
        }
        if (threadIdx.x == 0) /* the CPU's summation order */
            slots_by_expert(s_e, p.n_used, s_order);
    } else if (p.norm_w) {
        stage_x_norm<FMT>(xs, p.x, p.norm_w, p.eps, p.K, p.x_out);
    } else {
        stage_x<FMT>(xs, p.x, p.K);
    }
    __syncthreads(); /* x */

    int i = 0;
    for (int u = warp; u < units; u += ST_WARPS, i++) {
        cp_async_wait_upto(mine - 1 - i); /* this unit's group has landed (later ones may still fly) */
        __syncwarp();           /* ... for every lane's copies */
        const int a = 2 * (u / p.ks), s = u % p.ks;
        row_ref ra, rb;
        const bool la = local_row(p, s_e, s_w, v0, nv, nd2, a, ra);
        const bool lb = a + 1 < nr && local_row(p, s_e, s_w, v0, nv, nd2, a + 1, rb);
        if (!la && !lb)
            continue;
        /* a dead row a still computes (on stale bytes): its result is never read */
        const float4 *xr = p.kind == KIND_DOWN ? xs + (a / nd2) * (p.I / 4) : xs;
        unit_dot<FMT>(p, ubase + (size_t)u * ub_bytes, lb, s, xr, res, a);
    }
    __syncthreads();

    if (p.kind == KIND_DENSE) {
        for (int i = threadIdx.x; i < nv; i += ST_THREADS) {
            row_ref r;
            local_row(p, s_e, s_w, v0, nv, nd2, i, r);
            const int j = (int)(r.w - p.w);
            float v = finish<FMT>(*r.w, res_sum(res, i, p.ks)) + (r.w->bias ? r.w->bias[r.n] : 0.0f);
            float *dst = p.y[j] + r.n;
            *dst = p.residual ? __fadd_rn(*dst, v) : v;
        }
    } else if (p.kind == KIND_GATE_UP) {
        for (int i = threadIdx.x; i < nv; i += ST_THREADS) {
            row_ref rg, ru;
            float a = 0.0f;
            if (local_row(p, s_e, s_w, v0, nv, nd2, 2 * i, rg) && local_row(p, s_e, s_w, v0, nv, nd2, 2 * i + 1, ru)) {
                float gv = finish<FMT>(*rg.w, res_sum(res, 2 * i, p.ks));
                float uv = finish<FMT>(*ru.w, res_sum(res, 2 * i + 1, p.ks));
                if (rg.w->bias)
                    gv += rg.w->bias[rg.n];
                if (ru.w->bias)
                    uv += ru.w->bias[ru.n];
                a = dev_silu_mul(gv, uv);
            }
            p.out[v0 + i] = a; /* act is [pair, I]: row v = pair * I + n */
        }
    } else {
        for (int dl = threadIdx.x; dl < nv; dl += ST_THREADS) {
            float o = 0.0f;
            for (int jj = 0; jj < p.n_used; jj++) {
                const int j = s_order[jj];
                row_ref r;
                if (!local_row(p, s_e, s_w, v0, nv, nd2, j * nd2 + dl, r))
                    continue;
                float part = finish<FMT>(*r.w, res_sum(res, j * nd2 + dl, p.ks)) + (r.w->bias ? r.w->bias[r.n] : 0.0f);
                o = __fadd_rn(o, __fmul_rn(s_wt[j], part));
            }
            float *dst = p.out + v0 + dl;
            *dst = p.residual ? __fadd_rn(*dst, o) : o;
        }
    }
}

bool fmt_ok(enum weight_format fmt)
{
    return fmt == WEIGHT_NVFP4 || fmt == WEIGHT_BF16 || fmt == WEIGHT_F16;
}

/* Bytes of one row's weights and scales in shared memory. */
void row_layout(enum weight_format fmt, int K, int *row_bytes, int *scale_bytes)
{
    *row_bytes = fmt == WEIGHT_NVFP4 ? K / 2 : K * 2;
    *scale_bytes = fmt == WEIGHT_NVFP4 ? K / 16 : 0;
}

/* K must give 16-byte rows and scale rows, and enough chunks for a warp. */
bool k_fits(enum weight_format fmt, int64_t K)
{
    const int64_t C = fmt == WEIGHT_NVFP4 ? 32 : 8;
    return K > 0 && K < (1 << 24) && K % C == 0 && (fmt != WEIGHT_NVFP4 || K % 256 == 0);
}

/* Shared memory of a launch: x, the partial sums, every unit's weights. */
size_t smem_of(const st_params &p)
{
    const size_t units = (size_t)(p.max_rows + 1) / 2 * (size_t)p.ks;
    return (size_t)p.x_floats * 4 + (size_t)((p.max_rows * p.ks + 3) / 4) * 16 + units * (size_t)unit_bytes(p);
}

/* K slices: the fewest rounds of units per warp, counted in whole-row work; a slice keeps at
 * least a warp's width of chunks and 16-byte pieces of scales. Then everything must fit. */
bool fit_units(st_params &p, enum weight_format fmt, size_t budget)
{
    const int C = fmt == WEIGHT_NVFP4 ? 32 : 8, NC = p.K / C, groups = (p.max_rows + 1) / 2;
    /* whole rows per unit unless that leaves most warps idle: a unit costs ~150 instructions
     * of bookkeeping (measured on the H200: at 1 chunk a lane it doubled the kernel's count) */
    p.ks = 1;
    while (groups * p.ks < ST_WARPS / 2 && p.ks < 8) {
        const int ks = 2 * p.ks;
        if (NC % ks || NC / ks < 32 || (fmt == WEIGHT_NVFP4 && (NC / ks) % 8))
            break;
        p.ks = ks;
    }
    return smem_of(p) <= budget;
}

template <int FMT>
cudaError_t launch_fmt(cudaStream_t s, const st_params &p, int grid, bool pdl)
{
    size_t smem = smem_of(p);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(stream_kernel<FMT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem))
        return cudaErrorInvalidValue;
    return launch_pdl(pdl, stream_kernel<FMT>, dim3(grid), dim3(ST_THREADS), smem, s, p);
}

cudaError_t launch(cudaStream_t s, enum weight_format fmt, const st_params &p, int grid, bool pdl)
{
    switch (fmt) {
    case WEIGHT_NVFP4: return launch_fmt<WEIGHT_NVFP4>(s, p, grid, pdl);
    case WEIGHT_BF16: return launch_fmt<WEIGHT_BF16>(s, p, grid, pdl);
    case WEIGHT_F16: return launch_fmt<WEIGHT_F16>(s, p, grid, pdl);
    default: return cudaErrorInvalidValue;
    }
}

bool dense_params(st_params &p, enum weight_format fmt, int n_w, const cuda_wdev *w, const int64_t *N, int64_t K,
                  const float *x, float *const *y, const cuda_gemv_fuse *fuse, int grid, size_t budget)
{
    if (n_w < 1 || n_w > ST_MAX_JOBS || !fmt_ok(fmt) || !k_fits(fmt, K) || (uintptr_t)x % 16 || grid < 1)
        return false;
    p = st_params{};
    p.kind = KIND_DENSE;
    p.K = (int)K;
    p.n_jobs = n_w;
    int64_t T = 0;
    for (int j = 0; j < n_w; j++) {
        if ((uintptr_t)w[j].data % 16 || (uintptr_t)w[j].scale % 16)
            return false;
        p.w[j] = w[j];
        p.first[j] = (int)T;
        p.y[j] = y[j];
        T += N[j];
    }
    if (T > (1 << 24))
        return false;
    p.first[n_w] = (int)T;
    p.T = (int)T;
    p.x = x;
    if (fuse) {
        if ((fuse->norm_w && ((uintptr_t)fuse->norm_w | (uintptr_t)fuse->x_out) % 16) || fuse->pending)
            return false;
        p.norm_w = fuse->norm_w;
        p.eps = fuse->eps;
        p.x_out = fuse->x_out;
        p.residual = fuse->residual;
    }
    row_layout(fmt, p.K, &p.row_bytes, &p.scale_bytes);
    p.x_floats = p.K;
    p.max_rows = (int)((T + grid - 1) / grid);
    /* a weight larger than the SMs' shared memory (lm_head) is left to the other paths */
    return p.max_rows > 0 && fit_units(p, fmt, budget);
}

bool moe_params(st_params &p, int kind, enum weight_format fmt, const cuda_wdev *table, int n_experts, int64_t D,
                int64_t I, int n_used, int grid, size_t budget)
{
    if (!fmt_ok(fmt) || n_used < 1 || n_used > ST_MAX_USED || grid < 1 || D > (1 << 20) || I > (1 << 20))
        return false;
    p = st_params{};
    p.kind = kind;
    p.table = table;
    p.n_experts = n_experts;
    p.n_used = n_used;
    p.I = (int)I;
    if (kind == KIND_GATE_UP) {
        if (!k_fits(fmt, D) || I % 4)
            return false;
        p.K = (int)D;
        p.T = n_used * (int)I;
        p.x_floats = D;
        p.max_rows = (int)(2 * ((p.T + grid - 1) / grid));
    } else {
        if (!k_fits(fmt, I))
            return false;
        p.K = (int)I;
        p.T = (int)D;
        p.x_floats = n_used * (int)I;
        p.max_rows = (int)(n_used * (((D + grid - 1) / grid + 1) / 2 * 2));
    }
    row_layout(fmt, p.K, &p.row_bytes, &p.scale_bytes);
    return fit_units(p, fmt, budget);
}

} // namespace

extern "C" int cuda_stream_dense_supported(enum weight_format fmt, int n_w, const struct cuda_wdev *w,
                                           const int64_t *N, int64_t K, const float *x, int grid, size_t budget)
{
    st_params p;
    float *y[ST_MAX_JOBS] = {};
    return dense_params(p, fmt, n_w, w, N, K, x, y, nullptr, grid, budget);
}

extern "C" cudaError_t cuda_stream_dense(cudaStream_t stream, enum weight_format fmt, int n_w,
                                         const struct cuda_wdev *w, const int64_t *N, int64_t K, const float *x,
                                         float *const *y, const struct cuda_gemv_fuse *fuse, int grid,
                                         size_t budget, int pdl)
{
    st_params p;
    if (!dense_params(p, fmt, n_w, w, N, K, x, y, fuse, grid, budget))
        return cudaErrorInvalidValue;
    return launch(stream, fmt, p, grid, pdl != 0);
}

extern "C" int cuda_stream_moe_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                         int grid, size_t smem_gate_up, size_t smem_down)
{
    st_params p;
    return moe_params(p, KIND_GATE_UP, fmt, nullptr, 1, d_model, d_expert, n_used, grid, smem_gate_up) &&
           moe_params(p, KIND_DOWN, fmt, nullptr, 1, d_model, d_expert, n_used, grid, smem_down);
}

extern "C" cudaError_t cuda_stream_moe(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                                       int n_experts, int64_t d_model, int64_t d_expert, const float *x,
                                       const int32_t *ids, const float *weights, int n_used, float *act,
                                       float *out, int residual, int grid, size_t smem_gate_up, size_t smem_down,
                                       int pdl)
{
    st_params p;
    if (!moe_params(p, KIND_GATE_UP, fmt, table, n_experts, d_model, d_expert, n_used, grid, smem_gate_up))
        return cudaErrorInvalidValue;
    p.x = x;
    p.ids = ids;
    p.out = act;
    cudaError_t e = launch(stream, fmt, p, grid, pdl != 0);
    if (e != cudaSuccess)
        return e;
    if (!moe_params(p, KIND_DOWN, fmt, table, n_experts, d_model, d_expert, n_used, grid, smem_down))
        return cudaErrorInvalidValue;
    p.x = act;
    p.ids = ids;
    p.weights = weights;
    p.out = out;
    p.residual = residual;
    return launch(stream, fmt, p, grid, pdl != 0);
}
