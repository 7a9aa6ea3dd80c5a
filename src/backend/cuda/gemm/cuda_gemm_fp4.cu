/* cuda_gemm_fp4.cu — W4A4 NVFP4: y = x W^T with both operands in FP4 on the block-scaled tensor
 * cores of sm_120 (mma.sync m16n8k64 kind::mxf4nvf4, ue4m3 scale per 16): the plan's
 * "gemm_nvfp4_fp4_mma" and "moe_gemm_nvfp4_fp4_mma".
 *
 * NEVER RUN. No sm_120 GPU exists for this project: this file is compiled, not tested on hardware.
 * It is not in the CUDA backend's kernel registry (cuda_registry.c) and no dispatch calls it, so
 * the planner never picks it; keep it that way until a Blackwell run has checked, in this order:
 *   1. cuda_gemm_fp4_loadable() is 1 on the sm_120 GPU (and 0 on the H200);
 *   2. one MMA with one-hot inputs against the layout this file assumes (PTX ISA "Matrix Fragments
 *      for mma.m16n8k64", "Block Scaling for mma.sync"): A/B element 8t + i in nibble i of a
 *      register (low nibble first), SF_A of row g from lane 4g and of row g + 8 from lane 4g + 1,
 *      SF_B of column g from lane 4g, byte j of a scale register for k block j (the lane-to-row
 *      part is drawn in a figure, not written in the text), and that a scale byte 0 gives 0;
 *   3. the quantiser's bytes against fp4_quantize() (backend/cpu/cpu_fp4_ref.c), bit for bit
 *      (the quantiser is portable: this step can run on the H200 today);
 *   4. the GEMM against fp4_ref_gemm() within ~1e-5 relative (only the order of fp32
 *      accumulation differs), for every compiled tile, stages 2..4, ragged m and N, grouped tiles,
 *      with compute-sanitizer (racecheck, synccheck) once.
 * Until then cuda_gemm_fp4_emulate() (tests only) runs the kernel's own address arithmetic on the
 * host through a model of ldmatrix and of the MMA written from the PTX text, which is the evidence
 * we have that the data movement is right; it cannot show that the model matches the hardware.
 *
 * Activations: cuda_fp4_quantize() turns fp32 rows into NVFP4 once per GEMM input (an MoE reads
 * the quantised token rows through x_rows, as the other grouped GEMMs do). Per row a decode global
 * scale dec (per tensor: amax / (6 * 448), NVIDIA's recipe; per row; or a static input_scale), per
 * 16 elements sf = e4m3(amax_b / 6 / dec), per element e2m1(x / (sf * dec)), both casts to nearest
 * even and saturating: bit-exact with fp4_quantize(), whose comment defines the NaN/Inf policy
 * (the row's dec becomes NaN, so its outputs are NaN). The epilogue multiplies by dec * scale2
 * (row and weight global scales) and adds the bias. W4A4 adds the activations' quantisation noise
 * to the weights' (about 9% relative L2 each on Gaussian data, tests/unit/test_fp4_ref.c), so it is
 * less accurate than the weight-only paths (cuda_gemm_mma.cu): the numerics a W4A4 checkpoint was
 * calibrated for, not a drop-in for them.
 *
 * Tile: BM tokens x BN weight rows x BK k per stage (64 or 128 each), 4 warps (8 for 128 x 128)
 * as 2 x (warps / 2), each warp (BM / 2) x (BN * 2 / warps) of the output in m16n8 MMAs. A stage
 * is both operands' codes and scales, cp.async'ed into shared memory: (BM + BN) x BK x 9 / 16
 * bytes, `stages` (2..4, a run-time value) of them in flight, which is the planner's formula for
 * this family; the largest tile (128 x 128 x 128, 4 stages) takes 73728 + 1024 bytes, within
 * sm_120's 101376. Codes are read with ldmatrix (an FP4 register is four 16-bit lanes' worth of
 * bytes, which ldmatrix moves untouched); their 16-byte chunks are XOR-swizzled per row so the
 * eight rows of one ldmatrix hit eight different bank groups. Each lane reads its own scale word
 * (four k blocks, one u32, byte j = block j) from shared memory.
 *
 * The GEMM kernels exist only in images built for sm_120a / sm_121a / sm_120f (ptxas of nvcc 13.0
 * assembles the instruction for those and refuses it for sm_100a, sm_103a, sm_100f, sm_90a);
 * elsewhere their bodies are empty and declare no shared memory, which is how
 * cuda_gemm_fp4_loadable() tells them apart. The quantiser kernels are portable on purpose (step 3).
 *
 * Deliberately not here: split-K for small batches, TMA, warp specialisation, a fused quantiser
 * (the activations are read once more), the sm_100a tcgen05 path ("*_fp4_tcgen05").
 *
 * One file: the GEMM kernel and the quantiser share their __host__ __device__ arithmetic (tile
 * geometry, quantisation) with the host emulations the tests run, so that both execute the same
 * code.
 */
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/common/cuda_common.cuh"

#include "base/dtype.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include <vector>

#if defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL) ||                        \
    (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ / 100 == 12)
#define FP4_MMA_IMAGE 1 /* a compile-time target guard (DESIGN.md decision 5), not a run-time gate */
#endif

#define FP4_HD __host__ __device__ __forceinline__

namespace
{

enum { FP4_MAX_STAGES = 4, FP4_QUANT_THREADS = 256 };

/* ---- the quantiser's arithmetic: one definition for the kernel and cuda_fp4_quantize_host() ---- */

FP4_HD float fp4_div(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b); /* IEEE division whatever -prec-div says */
#else
    return a / b;
#endif
}

FP4_HD float fp4_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

FP4_HD float fp4_add(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

FP4_HD uint32_t fp4_as_uint(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

/* fp4_global_scale() of cpu_fp4_ref.c: amax / 2688, at least FLT_MIN; 1 for amax 0 */
FP4_HD float fp4_dec(float amax)
{
    return amax > 0.0f ? fmaxf(fp4_div(amax, 6.0f * 448.0f), FLT_MIN) : 1.0f;
}

/* f32_to_e4m3() for a >= 0 (+Inf saturates to 448, NaN gives 0x7f) */
FP4_HD uint32_t fp4_e4m3_code(float a)
{
    if (!(a == a))
        return 0x7fu;
    if (a >= 448.0f)
        return 0x7eu;
    if (a < 0.015625f)                     /* subnormal steps of 2^-9; 8 is the smallest normal */
        return (uint32_t)rintf(a * 512.0f); /* exact product, rounded to nearest even */
    const uint32_t u = fp4_as_uint(a), rest = u & 0xfffffu;
    uint32_t q = (u >> 20) & 7u; /* 3 of the 23 mantissa bits, rounded to nearest even below */
    q += rest > 0x80000u || (rest == 0x80000u && (q & 1u));
    const uint32_t code = (((u >> 23) - 120u) << 3) + q; /* a mantissa carry bumps the exponent */
    return code > 0x7eu ? 0x7eu : code;
}

/* e4m3_to_f32() for a code 0 .. 0x7e (cuda_common.cuh's decoder, host and device) */
FP4_HD float fp4_e4m3_value(uint32_t b)
{
    return e4m3_value(b);
}

/* f32_to_e2m1() for a finite v: the thresholds between neighbours, a tie to the even code */
FP4_HD uint32_t fp4_e2m1_code(float v)
{
    const float a = fabsf(v);
    const uint32_t c = (uint32_t)(a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                       (a >= 3.5f) + (a > 5.0f);
    return v < 0.0f && c ? c | 8u : c;
}

/* fp4_quantize_block(): 16 values -> their codes (element i in nibble i of lo | hi << 32) and the
 * scale byte; *finite false (scale and codes 0) for a block holding a NaN or an Inf. */
FP4_HD uint32_t fp4_quant_block(const float v[16], float dec, uint32_t *lo, uint32_t *hi, bool *finite)
{
    float amax = 0.0f;
    bool ok = true;
    for (int i = 0; i < 16; i++) {
        const float a = fabsf(v[i]);
        ok = ok && a <= FLT_MAX;
        amax = fmaxf(amax, a);
    }
    *finite = ok;
    *lo = *hi = 0;
    if (!ok)
        return 0;
    const uint32_t sf = fp4_e4m3_code(fp4_div(fp4_div(amax, 6.0f), dec));
    const float denom = fp4_mul(fp4_e4m3_value(sf), dec);
    if (denom > 0.0f) {
        for (int i = 0; i < 8; i++) {
            *lo |= fp4_e2m1_code(fp4_div(v[i], denom)) << (4 * i);
            *hi |= fp4_e2m1_code(fp4_div(v[8 + i], denom)) << (4 * i);
        }
    }
    return sf;
}

/* 16 codes (8 bytes) to an 8-byte aligned address */
FP4_HD void fp4_store8(uint8_t *p, uint32_t lo, uint32_t hi)
{
#ifdef __CUDA_ARCH__
    *(uint2 *)p = make_uint2(lo, hi);
#else
    memcpy(p, &lo, 4);
    memcpy(p + 4, &hi, 4);
#endif
}

/* the largest finite |value| among the float4s i = first, first + step, ... < n4 */
FP4_HD float fp4_finite_amax(const float4 *x, int64_t n4, int64_t first, int64_t step)
{
    float m = 0.0f;
    for (int64_t i = first; i < n4; i += step) {
        const float4 v = x[i];
        const float a[4] = {fabsf(v.x), fabsf(v.y), fabsf(v.z), fabsf(v.w)};
        for (int j = 0; j < 4; j++)
            if (a[j] <= FLT_MAX)
                m = fmaxf(m, a[j]);
    }
    return m;
}

/* Blocks b = first, first + step, ... of one row (K floats at xr) into its codes (K/2 bytes) and
 * scales (K/16 bytes); false if one of them held a NaN or an Inf. */
FP4_HD bool fp4_quant_row(const float *xr, int64_t K, float dec, uint8_t *codes, uint8_t *scales,
                          int64_t first, int64_t step)
{
    bool ok = true;
    for (int64_t b = first; b < K / 16; b += step) {
        const float4 *p = (const float4 *)(xr + 16 * b);
        float v[16];
        for (int j = 0; j < 4; j++) {
            const float4 q = p[j];
            v[4 * j] = q.x, v[4 * j + 1] = q.y, v[4 * j + 2] = q.z, v[4 * j + 3] = q.w;
        }
        uint32_t lo, hi;
        bool finite;
        scales[b] = (uint8_t)fp4_quant_block(v, dec, &lo, &hi, &finite);
        fp4_store8(codes + 8 * b, lo, hi);
        ok = ok && finite;
    }
    return ok;
}

struct quant_params {
    const float *x;
    int rows;
    int64_t K;
    int mode; /* enum cuda_fp4_scale */
    float input_scale;
    cuda_fp4_act a;
};

/* per-tensor amax of the finite |x| into *amax (zeroed before; non-negative floats order as their bits) */
__global__ void fp4_amax_kernel(const float4 *x, int64_t n4, uint32_t *amax)
{
    float m = fp4_finite_amax(x, n4, (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
                              (int64_t)gridDim.x * blockDim.x);
    m = warp_max(m);
    if (threadIdx.x % 32 == 0 && m > 0.0f)
        atomicMax(amax, __float_as_uint(m));
}

/* one warp per row: its decode scale, then its blocks lane, lane + 32, ... */
__global__ void __launch_bounds__(FP4_QUANT_THREADS) fp4_quant_kernel(quant_params p)
{
    const int row = (int)(blockIdx.x * (FP4_QUANT_THREADS / 32) + threadIdx.x / 32), lane = threadIdx.x % 32;
    if (row >= p.rows)
        return; /* the whole warp */
    const int64_t K = p.K;
    const float *xr = p.x + (size_t)row * (size_t)K;
    float dec = p.input_scale;
    if (p.mode == CUDA_FP4_SCALE_ROW)
        dec = fp4_dec(warp_max(fp4_finite_amax((const float4 *)xr, K / 4, lane, 32)));
    else if (p.mode == CUDA_FP4_SCALE_TENSOR)
        dec = fp4_dec(__uint_as_float(*p.a.amax));
    bool ok = fp4_quant_row(xr, K, dec, p.a.codes + (size_t)row * (size_t)(K / 2),
                            p.a.scales + (size_t)row * (size_t)(K / 16), lane, 32);
    ok = __all_sync(0xffffffffu, ok);
    if (lane == 0)
        p.a.row_scale[row] = ok ? dec : __uint_as_float(0x7fc00000u);
}

/* ---- the GEMM: tile geometry, shared by the kernel and cuda_gemm_fp4_emulate() ---- */

struct fp4_params {
    cuda_wdev w;            /* the weight when table == NULL */
    const cuda_wdev *table; /* per-expert weights (device) or NULL */
    int64_t N, K;
    const uint8_t *x_codes;   /* (rows of x, K/2) */
    const uint8_t *x_scales;  /* (rows of x, K/16) */
    const float *x_row_scale; /* (rows of x) */
    const int32_t *x_rows;    /* compact row -> x row * x_row_div, or NULL */
    int x_row_div;
    int m;
    const int32_t *tiles;
    const int32_t *n_tiles;
    float *y;
    int stages;
};

template <int BM_, int BN_, int BK_>
struct fp4_geom {
    static constexpr int BM = BM_, BN = BN_, BK = BK_;
    static constexpr int WARPS = BM * BN / 2048 < 4 ? 4 : BM * BN / 2048 > 8 ? 8 : BM * BN / 2048;
    static constexpr int THREADS = 32 * WARPS, WARPS_N = WARPS / 2;
    static constexpr int WM = BM / 2, WN = BN / WARPS_N, MT = WM / 16, NT = WN / 8;
    static constexpr int CHUNKS = BK / 32; /* 16-byte code chunks of a row per stage */
    static constexpr int SROW = BK / 16;   /* scale bytes of a row per stage */
    static constexpr int A_CODES = 0, B_CODES = BM * BK / 2, A_SC = (BM + BN) * BK / 2,
                         B_SC = A_SC + BM * SROW;
    static constexpr int STAGE = (BM + BN) * (BK / 2 + SROW);
    static constexpr int CODE_COPIES = (BM + BN) * CHUNKS;
    static_assert(BK % 64 == 0 && BK <= 256 && MT >= 1 && NT % 2 == 0, "tile");
    static_assert(CODE_COPIES % THREADS == 0 && STAGE % 16 == 0, "whole copies per thread, 16-byte stages");

    /* byte offset of chunk c of row r in a code region: chunks XOR-swizzled so that the 8
     * consecutive rows one ldmatrix reads start in 8 different 16-byte bank groups */
    static FP4_HD int code_off(int r, int c)
    {
        return r * (BK / 2) + 16 * (c ^ ((r / (8 / CHUNKS)) % CHUNKS));
    }
    /* copy i of a stage's codes: operand (0 x, 1 W), its row and chunk */
    static FP4_HD void code_copy(int i, int *op, int *row, int *chunk)
    {
        *op = i >= BM * CHUNKS;
        const int j = *op ? i - BM * CHUNKS : i;
        *row = j / CHUNKS;
        *chunk = j % CHUNKS;
    }
    /* the row and chunk whose 16 bytes `lane` points ldmatrix.x4 at, for the A tile of rows
     * r0 .. r0 + 15 at k64 step kc: matrices {rows 0-7, rows 8-15} x {k 0-31, k 32-63} in the
     * order of A's fragment registers a0 .. a3 */
    static FP4_HD void ldsm_a(int lane, int r0, int kc, int *row, int *chunk)
    {
        *row = r0 + lane % 8 + 8 * ((lane / 8) % 2);
        *chunk = 2 * kc + lane / 16;
    }
    /* the same for two B tiles, weight rows n0 .. n0 + 7 and n0 + 8 .. n0 + 15: registers
     * b0, b1 of the first, then b0, b1 of the second */
    static FP4_HD void ldsm_b(int lane, int n0, int kc, int *row, int *chunk)
    {
        *row = n0 + lane % 8 + 8 * (lane / 16);
        *chunk = 2 * kc + (lane / 8) % 2;
    }
    /* the row whose scale word `lane` passes (thread-id 0 selectors): A row g from lane 4g and
     * row g + 8 from lane 4g + 1 (lanes 4g + 2, 4g + 3 are not read); B column g from lane 4g */
    static FP4_HD int scale_a_row(int lane, int r0)
    {
        return r0 + lane / 4 + 8 * (lane % 2);
    }
    static FP4_HD int scale_b_row(int lane, int n0)
    {
        return n0 + lane / 4;
    }
    static FP4_HD int warp_m(int warp)
    {
        return (warp / WARPS_N) * WM;
    }
    static FP4_HD int warp_n(int warp)
    {
        return (warp % WARPS_N) * WN;
    }
    /* accumulator element 2h + q of m-tile i, n-tile j: row and column within the warp's tile */
    static FP4_HD int acc_row(int lane, int i, int h)
    {
        return 16 * i + lane / 4 + 8 * h;
    }
    static FP4_HD int acc_col(int lane, int j, int q)
    {
        return 8 * j + 2 * (lane % 4) + q;
    }
};

/* A row tile: which rows of x, and where they land in y. */
struct fp4_rows {
    int expert, row0, nrows;
};

FP4_HD bool fp4_tile(const fp4_params &p, int bx, int bm, fp4_rows *t)
{
    t->expert = 0;
    if (p.tiles) {
        if (bx >= *p.n_tiles)
            return false;
        t->expert = p.tiles[3 * bx];
        t->row0 = p.tiles[3 * bx + 1];
        t->nrows = p.tiles[3 * bx + 2];
    } else {
        t->row0 = bx * bm;
        t->nrows = p.m - t->row0 < bm ? p.m - t->row0 : bm;
    }
    return true;
}

/* row r of the tile: its row of x (-1: padding) */
FP4_HD int32_t fp4_src_row(const fp4_params &p, const fp4_rows &t, int r)
{
    if (r >= t.nrows)
        return -1;
    return p.x_rows ? p.x_rows[t.row0 + r] / p.x_row_div : t.row0 + r;
}

/* Copy i of the codes of the stage at k0: source (a valid address even when nothing is read),
 * bytes to read (16, or 0: zero-fill) and the offset in the stage. */
template <class G>
FP4_HD void fp4_code_src(const fp4_params &p, const cuda_wdev &w, const int32_t *src_row, int64_t n0,
                         int64_t k0, int i, const uint8_t **src, int *bytes, int *dst)
{
    int op, row, chunk;
    G::code_copy(i, &op, &row, &chunk);
    const int64_t n = op ? n0 + row : (int64_t)src_row[row];
    const bool ok = op ? n < p.N : n >= 0;
    const uint8_t *base = op ? (const uint8_t *)w.data : p.x_codes;
    *src = base + (ok ? n : 0) * (p.K / 2) + k0 / 2 + 16 * chunk;
    *bytes = ok ? 16 : 0;
    *dst = (op ? G::B_CODES : G::A_CODES) + G::code_off(row, chunk);
}

/* Copy i < BM + BN of the stage's scales (SROW bytes each). */
template <class G>
FP4_HD void fp4_scale_src(const fp4_params &p, const cuda_wdev &w, const int32_t *src_row, int64_t n0,
                          int64_t k0, int i, const uint8_t **src, int *bytes, int *dst)
{
    const bool op = i >= G::BM;
    const int row = op ? i - G::BM : i;
    const int64_t n = op ? n0 + row : (int64_t)src_row[row];
    const bool ok = op ? n < p.N : n >= 0;
    const uint8_t *base = op ? (const uint8_t *)w.scale : p.x_scales;
    *src = base + (ok ? n : 0) * (p.K / 16) + k0 / 16;
    *bytes = ok ? G::SROW : 0;
    *dst = (op ? G::B_SC : G::A_SC) + row * G::SROW;
}

/* y = acc * (row_scale * scale2) + bias, in this order in both implementations */
FP4_HD float fp4_out(float acc, float row_alpha, const cuda_wdev &w, int64_t n)
{
    return fp4_add(fp4_mul(acc, fp4_mul(row_alpha, w.scale2)), w.bias ? w.bias[n] : 0.0f);
}

#if defined(FP4_MMA_IMAGE)

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_small(uint32_t dst, const void *src, int bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* until the group of the stage about to be read has landed: stages - 2 newer groups may still fly */
__device__ __forceinline__ void cp_async_wait_stage(int stages)
{
    if (stages >= 4)
        cp_async_wait<2>();
    else if (stages == 3)
        cp_async_wait<1>();
    else
        cp_async_wait<0>();
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* d (16 x 8 fp32) += (A * SF_A) (B * SF_B): A 16 x 64 e2m1, B 64 x 8 e2m1, 4 ue4m3 scales per
 * row of A / column of B (one per 16 of k), selectors {byte 0, thread 0} (scale_vec::4X reads
 * all four bytes of the lanes the thread selector picks) */
__device__ __forceinline__ void mma_fp4(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                        uint32_t sfa, uint32_t sfb)
{
    asm volatile(
        "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32."
        "ue4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {0, 0}, %11, {0, 0};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(sfa), "r"(sfb));
}

#endif

template <int BM, int BN, int BK>
__global__ void __launch_bounds__(fp4_geom<BM, BN, BK>::THREADS) gemm_fp4_kernel(fp4_params p)
{
#if defined(FP4_MMA_IMAGE)
    using G = fp4_geom<BM, BN, BK>;
    __shared__ int32_t src_row[BM];
    __shared__ float row_alpha[BM];
    extern __shared__ __align__(128) uint8_t fp4_smem[]; /* (stages, STAGE bytes): see fp4_geom */

    fp4_rows t;
    if (!fp4_tile(p, (int)blockIdx.x, BM, &t))
        return;
    const cuda_wdev w = p.table ? p.table[t.expert] : p.w;
    const int64_t n0 = (int64_t)blockIdx.y * BN;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    for (int r = tid; r < BM; r += G::THREADS) {
        const int32_t s = fp4_src_row(p, t, r);
        src_row[r] = s;
        row_alpha[r] = s >= 0 ? p.x_row_scale[s] : 0.0f;
    }
    __syncthreads();

    const uint32_t smem0 = (uint32_t)__cvta_generic_to_shared(fp4_smem);
    auto load_stage = [&](int st, int64_t k0) {
        const uint32_t base = smem0 + (uint32_t)(st * G::STAGE);
#pragma unroll
        for (int i = tid; i < G::CODE_COPIES; i += G::THREADS) {
            const uint8_t *src;
            int bytes, dst;
            fp4_code_src<G>(p, w, src_row, n0, k0, i, &src, &bytes, &dst);
            cp_async16(base + (uint32_t)dst, src, bytes);
        }
        for (int i = tid; i < BM + BN; i += G::THREADS) {
            const uint8_t *src;
            int bytes, dst;
            fp4_scale_src<G>(p, w, src_row, n0, k0, i, &src, &bytes, &dst);
            cp_async_small<G::SROW>(base + (uint32_t)dst, src, bytes);
        }
    };

    float acc[G::MT][G::NT][4];
#pragma unroll
    for (int i = 0; i < G::MT; i++)
#pragma unroll
        for (int j = 0; j < G::NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.0f;

    const int wm = G::warp_m(warp), wn = G::warp_n(warp), stages = p.stages;
    const int kt_n = (int)(p.K / BK);
    for (int s = 0; s < stages - 1; s++) { /* one commit group per stage, empty ones included */
        if (s < kt_n)
            load_stage(s, (int64_t)s * BK);
        cp_async_commit();
    }
    for (int kt = 0; kt < kt_n; kt++) {
        cp_async_wait_stage(stages);
        __syncthreads(); /* stage kt landed for every thread; stage kt - 1 is read by no warp any more */
        const int pre = kt + stages - 1;
        if (pre < kt_n)
            load_stage(pre % stages, (int64_t)pre * BK); /* into the stage of kt - 1 */
        cp_async_commit();

        const int st = kt % stages;
        const uint32_t base = smem0 + (uint32_t)(st * G::STAGE);
        const uint8_t *sbase = fp4_smem + st * G::STAGE;
#pragma unroll
        for (int kc = 0; kc < BK / 64; kc++) {
            uint32_t a[G::MT][4], sa[G::MT], b[G::NT][2], sb[G::NT];
#pragma unroll
            for (int i = 0; i < G::MT; i++) {
                int row, chunk;
                G::ldsm_a(lane, wm + 16 * i, kc, &row, &chunk);
                ldsm_x4(a[i], base + (uint32_t)(G::A_CODES + G::code_off(row, chunk)));
                sa[i] = *(const uint32_t *)(sbase + G::A_SC + G::scale_a_row(lane, wm + 16 * i) * G::SROW +
                                            4 * kc);
            }
#pragma unroll
            for (int j = 0; j < G::NT; j += 2) {
                int row, chunk;
                uint32_t q[4];
                G::ldsm_b(lane, wn + 8 * j, kc, &row, &chunk);
                ldsm_x4(q, base + (uint32_t)(G::B_CODES + G::code_off(row, chunk)));
                b[j][0] = q[0], b[j][1] = q[1], b[j + 1][0] = q[2], b[j + 1][1] = q[3];
            }
#pragma unroll
            for (int j = 0; j < G::NT; j++)
                sb[j] = *(const uint32_t *)(sbase + G::B_SC + G::scale_b_row(lane, wn + 8 * j) * G::SROW +
                                            4 * kc);
#pragma unroll
            for (int i = 0; i < G::MT; i++)
#pragma unroll
                for (int j = 0; j < G::NT; j++)
                    mma_fp4(acc[i][j], a[i], b[j][0], b[j][1], sa[i], sb[j]);
        }
    }
    cp_async_wait<0>(); /* no group may outlive the block (the empty tail ones included) */

#pragma unroll
    for (int i = 0; i < G::MT; i++)
#pragma unroll
        for (int j = 0; j < G::NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = wm + G::acc_row(lane, i, e / 2);
                const int64_t n = n0 + wn + G::acc_col(lane, j, e % 2);
                if (r < t.nrows && n < p.N)
                    p.y[(size_t)(t.row0 + r) * (size_t)p.N + (size_t)n] =
                        fp4_out(acc[i][j][e], row_alpha[r], w, n);
            }
#endif /* not an sm_120-family image: an empty body with no shared memory (see the file comment) */
}

/* The compiled tiles. */
struct fp4_config {
    int bm, bn, bk;
};

const fp4_config FP4_CONFIGS[] = {
    {64, 64, 64},  {64, 64, 128},  {64, 128, 64},  {64, 128, 128},
    {128, 64, 64}, {128, 64, 128}, {128, 128, 64}, {128, 128, 128},
};

size_t fp4_smem_bytes(int bm, int bn, int bk, int stages)
{
    return (size_t)stages * (size_t)(bm + bn) * (size_t)(bk / 2 + bk / 16) + (size_t)bm * 8;
}

/* ---- host emulation: the kernel's address arithmetic against a model of the instructions ---- */

/* ldmatrix.sync.aligned.m8n8.x4.b16 as the PTX ISA describes it: row i of matrix q is the 16 bytes
 * at the address lane 8q + i supplies; lane l receives, in register q, the 32-bit word l % 4 of
 * row l / 4 of matrix q. */
void emu_ldmatrix_x4(const uint8_t *smem, const int addr[32], uint32_t out[32][4])
{
    for (int l = 0; l < 32; l++)
        for (int q = 0; q < 4; q++)
            memcpy(&out[l][q], smem + addr[8 * q + l / 4] + 4 * (l % 4), 4);
}

/* mma.sync m16n8k64 kind::mxf4nvf4 scale_vec::4X ue4m3, selectors {0, 0}, from the PTX ISA
 * ("Matrix Fragments for mma.m16n8k64", "Block Scaling for mma.sync"): groupID g = lane / 4,
 * t = lane % 4; A element i (0..31, nibble i % 8 of register i / 8) is row g (i < 8 or
 * 16 <= i < 24) or g + 8, column 8t + i % 8 (+ 32 for i >= 16); B element i (0..15) is row
 * 8t + i % 8 (+ 32 for i >= 8), column g; thread-id 0 takes SF_A from lanes t = 0 (row g) and
 * t = 1 (row g + 8) and SF_B from lanes t = 0 (column g), byte j scaling k 16j .. 16j + 15;
 * D element e is row g (+ 8 for e >= 2), column 2t + e % 2. The sum is taken in double and
 * added to d once, a stand-in for the hardware's unspecified fp32 accumulation order. */
void emu_mma(float d[32][4], const uint32_t a[32][4], const uint32_t b[32][2], const uint32_t sa[32],
             const uint32_t sb[32])
{
    float A[16][64], B[64][8], SA[16][4], SB[4][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < 32; i++) {
            const int row = (i < 8 || (i >= 16 && i < 24)) ? g : g + 8;
            A[row][8 * t + i % 8 + (i >= 16 ? 32 : 0)] =
                e2m1_to_f32((uint8_t)((a[l][i / 8] >> (4 * (i % 8))) & 15u));
        }
        for (int i = 0; i < 16; i++)
            B[8 * t + i % 8 + (i >= 8 ? 32 : 0)][g] =
                e2m1_to_f32((uint8_t)((b[l][i / 8] >> (4 * (i % 8))) & 15u));
        for (int j = 0; j < 4; j++) {
            const float s = e4m3_to_f32((uint8_t)(sa[l] >> (8 * j)));
            if (t == 0)
                SA[g][j] = s;
            else if (t == 1)
                SA[g + 8][j] = s;
            if (t == 0)
                SB[j][g] = e4m3_to_f32((uint8_t)(sb[l] >> (8 * j)));
        }
    }
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 4; e++) {
            const int r = l / 4 + 8 * (e / 2), c = 2 * (l % 4) + e % 2;
            double s = 0;
            for (int k = 0; k < 64; k++)
                s += (double)A[r][k] * SA[r][k / 16] * B[k][c] * SB[k / 16][c];
            d[l][e] = (float)((double)d[l][e] + s);
        }
}

/* The kernel's tiles on the host, one block at a time, threads in turn between its barriers: the
 * same row tiles, copy descriptors, swizzle, ldmatrix row choice, scale lanes and epilogue, with
 * emu_ldmatrix_x4() and emu_mma() standing in for the instructions. Dense (p.tiles == NULL) only;
 * the stage index and cp.async pipeline are not modelled (one stage buffer suffices in order). */
template <int BM, int BN, int BK>
void emu_gemm(const fp4_params &p)
{
    using G = fp4_geom<BM, BN, BK>;
    std::vector<uint8_t> stage(G::STAGE);
    std::vector<float> acc((size_t)G::WARPS * G::MT * G::NT * 32 * 4);
    int32_t src_row[BM];
    float row_alpha[BM];
    const int64_t col_tiles = (p.N + BN - 1) / BN;
    for (int bx = 0; bx < (p.m + BM - 1) / BM; bx++)
        for (int64_t by = 0; by < col_tiles; by++) {
            fp4_rows t = {};
            fp4_tile(p, bx, BM, &t);
            const cuda_wdev &w = p.w;
            const int64_t n0 = by * BN;
            for (int r = 0; r < BM; r++) {
                src_row[r] = fp4_src_row(p, t, r);
                row_alpha[r] = src_row[r] >= 0 ? p.x_row_scale[src_row[r]] : 0.0f;
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t k0 = 0; k0 < p.K; k0 += BK) {
                std::fill(stage.begin(), stage.end(), (uint8_t)0xa5); /* what no copy wrote shows */
                for (int i = 0; i < G::CODE_COPIES; i++) {
                    const uint8_t *src;
                    int bytes, dst;
                    fp4_code_src<G>(p, w, src_row, n0, k0, i, &src, &bytes, &dst);
                    memset(&stage[(size_t)dst], 0, 16);
                    memcpy(&stage[(size_t)dst], src, (size_t)bytes);
                }
                for (int i = 0; i < BM + BN; i++) {
                    const uint8_t *src;
                    int bytes, dst;
                    fp4_scale_src<G>(p, w, src_row, n0, k0, i, &src, &bytes, &dst);
                    memset(&stage[(size_t)dst], 0, G::SROW);
                    memcpy(&stage[(size_t)dst], src, (size_t)bytes);
                }
                for (int warp = 0; warp < G::WARPS; warp++) {
                    const int wm = G::warp_m(warp), wn = G::warp_n(warp);
                    for (int kc = 0; kc < BK / 64; kc++) {
                        static uint32_t a[G::MT][32][4], b[G::NT][32][2], sa[G::MT][32], sb[G::NT][32];
                        int addr[32];
                        for (int i = 0; i < G::MT; i++) {
                            for (int l = 0; l < 32; l++) {
                                int row, chunk;
                                G::ldsm_a(l, wm + 16 * i, kc, &row, &chunk);
                                addr[l] = G::A_CODES + G::code_off(row, chunk);
                                memcpy(&sa[i][l],
                                       &stage[(size_t)(G::A_SC + G::scale_a_row(l, wm + 16 * i) * G::SROW +
                                                       4 * kc)],
                                       4);
                            }
                            emu_ldmatrix_x4(stage.data(), addr, a[i]);
                        }
                        for (int j = 0; j < G::NT; j += 2) {
                            uint32_t q[32][4];
                            for (int l = 0; l < 32; l++) {
                                int row, chunk;
                                G::ldsm_b(l, wn + 8 * j, kc, &row, &chunk);
                                addr[l] = G::B_CODES + G::code_off(row, chunk);
                            }
                            emu_ldmatrix_x4(stage.data(), addr, q);
                            for (int l = 0; l < 32; l++)
                                b[j][l][0] = q[l][0], b[j][l][1] = q[l][1], b[j + 1][l][0] = q[l][2],
                                b[j + 1][l][1] = q[l][3];
                        }
                        for (int j = 0; j < G::NT; j++)
                            for (int l = 0; l < 32; l++)
                                memcpy(&sb[j][l],
                                       &stage[(size_t)(G::B_SC + G::scale_b_row(l, wn + 8 * j) * G::SROW +
                                                       4 * kc)],
                                       4);
                        for (int i = 0; i < G::MT; i++)
                            for (int j = 0; j < G::NT; j++) {
                                float(*d)[4] =
                                    (float(*)[4]) & acc[(((size_t)warp * G::MT + i) * G::NT + j) * 32 * 4];
                                emu_mma(d, a[i], b[j], sa[i], sb[j]);
                            }
                    }
                }
            }
            for (int warp = 0; warp < G::WARPS; warp++)
                for (int i = 0; i < G::MT; i++)
                    for (int j = 0; j < G::NT; j++)
                        for (int l = 0; l < 32; l++)
                            for (int e = 0; e < 4; e++) {
                                const int r = G::warp_m(warp) + G::acc_row(l, i, e / 2);
                                const int64_t n = n0 + G::warp_n(warp) + G::acc_col(l, j, e % 2);
                                const float v =
                                    acc[((((size_t)warp * G::MT + i) * G::NT + j) * 32 + l) * 4 + e];
                                if (r < t.nrows && n < p.N)
                                    p.y[(size_t)(t.row0 + r) * (size_t)p.N + (size_t)n] =
                                        fp4_out(v, row_alpha[r], w, n);
                            }
        }
}

/* ---- dispatch over the compiled tiles ---- */

template <int BM, int BN, int BK>
cudaError_t fp4_launch(cudaStream_t stream, const fp4_params &p, int row_tiles)
{
    using G = fp4_geom<BM, BN, BK>;
    auto kernel = gemm_fp4_kernel<BM, BN, BK>;
    const int64_t col_tiles = (p.N + BN - 1) / BN;
    if (col_tiles > 65535)
        return cudaErrorInvalidValue;
    const size_t smem = (size_t)p.stages * G::STAGE;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return e;
    kernel<<<dim3((unsigned)row_tiles, (unsigned)col_tiles), G::THREADS, smem, stream>>>(p);
    return CUDA_LAUNCH_RESULT();
}

/* What to do with cfg's kernel. */
enum fp4_action { FP4_ATTRS, FP4_LAUNCH, FP4_EMULATE };

cudaError_t fp4_dispatch(const fp4_config &cfg, enum fp4_action act, cudaFuncAttributes *a,
                         cudaStream_t stream, const fp4_params *p, int row_tiles)
{
#define FP4_CASE(BM, BN, BK)                                                                                \
    if (cfg.bm == BM && cfg.bn == BN && cfg.bk == BK) {                                                     \
        if (act == FP4_ATTRS)                                                                               \
            return cudaFuncGetAttributes(a, gemm_fp4_kernel<BM, BN, BK>);                                   \
        if (act == FP4_EMULATE) {                                                                           \
            emu_gemm<BM, BN, BK>(*p);                                                                       \
            return cudaSuccess;                                                                             \
        }                                                                                                   \
        return fp4_launch<BM, BN, BK>(stream, *p, row_tiles);                                               \
    }
    FP4_CASE(64, 64, 64)
    FP4_CASE(64, 64, 128)
    FP4_CASE(64, 128, 64)
    FP4_CASE(64, 128, 128)
    FP4_CASE(128, 64, 64)
    FP4_CASE(128, 64, 128)
    FP4_CASE(128, 128, 64)
    FP4_CASE(128, 128, 128)
#undef FP4_CASE
    return cudaErrorInvalidValue;
}

bool fp4_find(const cuda_fp4_tile *t, int64_t K, fp4_config *out)
{
    if (t->stages < 2 || t->stages > FP4_MAX_STAGES || K % t->k)
        return false;
    for (const fp4_config &cfg : FP4_CONFIGS)
        if (cfg.bm == t->tokens && cfg.bn == t->rows && cfg.bk == t->k) {
            *out = cfg;
            return true;
        }
    return false;
}

size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

} // namespace

/* ---- activations ---- */

extern "C" size_t cuda_fp4_act_bytes(int rows, int64_t K)
{
    const size_t r = rows > 0 ? (size_t)rows : 0, k = K > 0 ? (size_t)K : 0;
    return align16(r * k / 2) + align16(r * k / 16) + align16(r * sizeof(float)) + 16;
}

extern "C" void cuda_fp4_act_carve(void *base, int rows, int64_t K, struct cuda_fp4_act *a)
{
    const size_t r = rows > 0 ? (size_t)rows : 0, k = K > 0 ? (size_t)K : 0;
    uint8_t *p = (uint8_t *)base;
    a->codes = p;
    p += align16(r * k / 2);
    a->scales = p;
    p += align16(r * k / 16);
    a->row_scale = (float *)p;
    p += align16(r * sizeof(float));
    a->amax = (uint32_t *)p;
}

extern "C" int cuda_fp4_quantize_supported(int64_t K, const float *x)
{
    /* whole blocks of 16, 16-byte x loads */
    return K >= 16 && K % 16 == 0 && (uintptr_t)x % 16 == 0;
}

static bool fp4_scale_ok(enum cuda_fp4_scale mode, float input_scale)
{
    if (mode == CUDA_FP4_SCALE_STATIC)
        return input_scale > 0.0f && input_scale <= FLT_MAX;
    return mode == CUDA_FP4_SCALE_TENSOR || mode == CUDA_FP4_SCALE_ROW;
}

extern "C" cudaError_t cuda_fp4_quantize(cudaStream_t stream, const float *x, int rows, int64_t K,
                                         enum cuda_fp4_scale mode, float input_scale,
                                         const struct cuda_fp4_act *a)
{
    if (rows <= 0)
        return cudaSuccess;
    if (!cuda_fp4_quantize_supported(K, x) || !fp4_scale_ok(mode, input_scale))
        return cudaErrorInvalidValue;
    if (mode == CUDA_FP4_SCALE_TENSOR) {
        cudaError_t e = cudaMemsetAsync(a->amax, 0, sizeof(uint32_t), stream);
        if (e != cudaSuccess)
            return e;
        const int64_t n4 = (int64_t)rows * K / 4;
        unsigned blocks = cuda_blocks((size_t)n4, FP4_QUANT_THREADS);
        blocks = blocks > 1024 ? 1024 : blocks; /* grid-stride: fewer atomics */
        fp4_amax_kernel<<<blocks, FP4_QUANT_THREADS, 0, stream>>>((const float4 *)x, n4, a->amax);
        e = CUDA_LAUNCH_RESULT();
        if (e != cudaSuccess)
            return e;
    }
    quant_params p = {x, rows, K, (int)mode, input_scale, *a};
    const unsigned blocks = (unsigned)((rows + FP4_QUANT_THREADS / 32 - 1) / (FP4_QUANT_THREADS / 32));
    fp4_quant_kernel<<<blocks, FP4_QUANT_THREADS, 0, stream>>>(p);
    return CUDA_LAUNCH_RESULT();
}

extern "C" int cuda_fp4_quantize_host(const float *x, int rows, int64_t K, enum cuda_fp4_scale mode,
                                      float input_scale, const struct cuda_fp4_act *a)
{
    if (rows < 0 || K < 16 || K % 16 || !fp4_scale_ok(mode, input_scale))
        return 0;
    float dec = input_scale;
    if (mode == CUDA_FP4_SCALE_TENSOR) /* the kernel's: a max over per-thread maxima, the same value */
        dec = fp4_dec(fp4_finite_amax((const float4 *)x, (int64_t)rows * K / 4, 0, 1));
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)K;
        const float d =
            mode == CUDA_FP4_SCALE_ROW ? fp4_dec(fp4_finite_amax((const float4 *)xr, K / 4, 0, 1)) : dec;
        const bool ok = fp4_quant_row(xr, K, d, a->codes + (size_t)r * (size_t)(K / 2),
                                      a->scales + (size_t)r * (size_t)(K / 16), 0, 1);
        a->row_scale[r] = ok ? d : NAN;
    }
    return 1;
}

/* ---- the GEMM ---- */

extern "C" int cuda_gemm_fp4_loadable(int device)
{
    if (cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    for (const fp4_config &cfg : FP4_CONFIGS) {
        cudaFuncAttributes a;
        if (fp4_dispatch(cfg, FP4_ATTRS, &a, 0, NULL, 0) != cudaSuccess) {
            (void)cudaGetLastError(); /* no image for this device: not a sticky error */
            return 0;
        }
        if (a.sharedSizeBytes < (size_t)cfg.bm * 8)
            return 0; /* the empty body of an image without the instruction: no row tables */
    }
    return 1;
}

extern "C" int cuda_gemm_fp4_supported(int64_t K)
{
    /* whole k64 MMA steps; then every row of codes starts 32-byte and of scales 4-byte aligned */
    return K >= 64 && K % 64 == 0;
}

extern "C" size_t cuda_gemm_fp4_smem(int tokens, int rows, int k, int stages)
{
    return fp4_smem_bytes(tokens, rows, k, stages);
}

extern "C" int cuda_gemm_fp4_fit(struct cuda_fp4_tile *t, int64_t K, double rows_hint, size_t budget)
{
    if (!cuda_gemm_fp4_supported(K))
        return 0;
    int bm = t->tokens >= 128 && rows_hint > 64 ? 128 : 64;
    int bn = t->rows >= 128 ? 128 : 64;
    int bk = t->k >= 128 && K % 128 == 0 ? 128 : 64;
    int st = t->stages < 2 ? 2 : t->stages > FP4_MAX_STAGES ? FP4_MAX_STAGES : t->stages;
    while (fp4_smem_bytes(bm, bn, bk, st) > budget) {
        if (st > 2)
            st--;
        else if (bk > 64)
            bk = 64;
        else if (bn > 64)
            bn = 64;
        else if (bm > 64)
            bm = 64;
        else
            return 0;
    }
    t->tokens = bm;
    t->rows = bn;
    t->k = bk;
    t->stages = st;
    t->smem_bytes = fp4_smem_bytes(bm, bn, bk, st);
    return 1;
}

static fp4_params fp4_params_of(int64_t N, int64_t K, const struct cuda_fp4_act *x, float *y, int stages)
{
    fp4_params p = {};
    p.N = N;
    p.K = K;
    p.x_codes = x->codes;
    p.x_scales = x->scales;
    p.x_row_scale = x->row_scale;
    p.x_row_div = 1;
    p.y = y;
    p.stages = stages;
    return p;
}

extern "C" cudaError_t cuda_gemm_fp4(cudaStream_t stream, const struct cuda_wdev *w, int64_t N, int64_t K,
                                     const struct cuda_fp4_act *x, int m, float *y,
                                     const struct cuda_fp4_tile *t)
{
    fp4_config cfg;
    if (!cuda_gemm_fp4_supported(K) || !fp4_find(t, K, &cfg))
        return cudaErrorInvalidValue;
    if (m <= 0 || N <= 0)
        return cudaSuccess;
    fp4_params p = fp4_params_of(N, K, x, y, t->stages);
    p.w = *w;
    p.m = m;
    return fp4_dispatch(cfg, FP4_LAUNCH, NULL, stream, &p, (m + cfg.bm - 1) / cfg.bm);
}

extern "C" cudaError_t cuda_gemm_fp4_grouped(cudaStream_t stream, const struct cuda_wdev *table, int64_t N,
                                             int64_t K, const struct cuda_fp4_act *x, const int32_t *x_rows,
                                             int x_row_div, const int32_t *tiles, const int32_t *n_tiles,
                                             int max_tiles, float *y, const struct cuda_fp4_tile *t)
{
    fp4_config cfg;
    if (!cuda_gemm_fp4_supported(K) || !fp4_find(t, K, &cfg) || x_row_div < 1)
        return cudaErrorInvalidValue;
    if (N <= 0 || max_tiles <= 0)
        return cudaSuccess;
    fp4_params p = fp4_params_of(N, K, x, y, t->stages);
    p.table = table;
    p.x_rows = x_rows;
    p.x_row_div = x_row_div;
    p.tiles = tiles;
    p.n_tiles = n_tiles;
    return fp4_dispatch(cfg, FP4_LAUNCH, NULL, stream, &p, max_tiles);
}

extern "C" int cuda_gemm_fp4_emulate(const struct cuda_wdev *w, int64_t N, int64_t K,
                                     const struct cuda_fp4_act *x, int m, float *y,
                                     const struct cuda_fp4_tile *t)
{
    fp4_config cfg;
    if (!cuda_gemm_fp4_supported(K) || !fp4_find(t, K, &cfg) || m < 0 || N < 0)
        return 0;
    fp4_params p = fp4_params_of(N, K, x, y, t->stages);
    p.w = *w;
    p.m = m;
    return fp4_dispatch(cfg, FP4_EMULATE, NULL, 0, &p, 0) == cudaSuccess;
}
