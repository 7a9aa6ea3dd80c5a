/* cpu_gemm.c — y = x · Wᵀ (+ bias) straight from the stored weight format (see cpu_gemm.h).
 *
 * Two algorithms, chosen by the number of x rows m:
 *  - fused (m <= FUSED_M_MAX, decode): memory-bound, so W must be streamed
 *    once. A thread takes FUSED_R consecutive W rows, converts 16 elements of
 *    each to fp32 in registers and multiplies them into up to FUSED_M x rows
 *    at once (dot-product form, one horizontal sum per output). Later passes
 *    over the x rows find the same W rows still in L1/L2, so DRAM sees W once.
 *  - panel (larger m, prefill): compute-bound. A thread converts up to
 *    ITEM_N_MAX W rows x KC columns into transposed fp32 micro-panels
 *    (panel[k][16], 64 KB on its stack), then a register-blocked micro-kernel
 *    broadcasts x[i][k] against 16 W rows at a time (6 x 16 on AVX2), so each
 *    converted W element is reused by every x row and each x element by 16 W
 *    rows. y is written on the first KC chunk and accumulated on the others.
 * Every format has AVX2+FMA+F16C kernels (selected at run time, the binary
 * stays baseline x86-64) and a portable C path (panel algorithm for every m,
 * written so that compilers vectorise its inner loop for any target).
 *
 * Deliberately not here: repacking W at load, reduced-precision activations,
 * any dequantised copy of W (scratch is at most ITEM_N_MAX x KC floats per
 * thread), choosing the thread count (OpenMP defaults rule).
 *
 * Invariants: reads stay inside W [rows, cols], its scales, and x [m, cols]
 * (K tails that are not a multiple of 16 go through scalar code, never wider
 * loads); writes stay inside y [m, rows]. Each path computes every W element
 * with at most one rounding (fp8: e4m3 * block scale; nvfp4: the exact
 * e2m1 * e4m3 product times scale2, which the fused path applies to the sum
 * instead), so paths differ only in summation order.
 *
 * One file: the portable and AVX2 kernels plug into static drivers and tables
 * (panel_run, fused_run, PANEL_*, FUSED_TILES) and share the static weight
 * decoders; the AVX2 ones need only target attributes, not other flags.
 */
#include "backend/cpu/cpu_gemm.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <omp.h>

#include "base/dtype.h"
#include "base/status.h"

#if defined(__x86_64__)
#define CPU_GEMM_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define CPU_GEMM_X86 0
#endif

enum {
    KC = 256,         /* K columns per panel chunk; a multiple of 128 (fp8) and 16 (nvfp4) blocks */
    PANEL_N = 16,     /* W rows per micro-panel = y columns per micro-tile */
    ITEM_N_MAX = 64,  /* W rows per work item of the panel path: 64 KB of panel, x strip reused 4x */
    MR_PORTABLE = 2,  /* x rows per portable micro-tile */
    MR_AVX2 = 6,      /* x rows per AVX2 micro-tile: 12 accumulators + 2 panel + 1 broadcast ymm */
    FUSED_R = 4,      /* W rows converted together in the fused path */
    FUSED_M = 4,      /* most x rows per pass of the fused path */
    FUSED_M_MAX = 8,  /* largest m that uses the fused path */
    MIN_PARALLEL_MACS = 1 << 18, /* below this a fork/join costs more than it saves */
};

/* E4M3 -> f32 for all 256 codes as a constant table, so the fp8 and nvfp4
 * scalar paths need no ldexpf and no run-time initialisation. Matches
 * e4m3_to_f32() in base/dtype.h (0x7f/0xff are NaN, exp 0 is subnormal). */
#define E4M3_MAG(b)                                                                                \
    (((b) >> 3) == 0 ? (float)((b)&7) * 0x1p-9f                                                    \
                     : (float)(8 + ((b)&7)) * (float)(1u << ((b) >> 3)) * 0x1p-10f)
#define E4M3_VAL(b)                                                                                \
    (((b)&0x7f) == 0x7f ? NAN : ((b)&0x80) ? -E4M3_MAG((b)&0x7f) : E4M3_MAG((b)&0x7f))
#define E4M3_4(b) E4M3_VAL(b), E4M3_VAL((b) + 1), E4M3_VAL((b) + 2), E4M3_VAL((b) + 3)
#define E4M3_16(b) E4M3_4(b), E4M3_4((b) + 4), E4M3_4((b) + 8), E4M3_4((b) + 12)
#define E4M3_64(b) E4M3_16(b), E4M3_16((b) + 16), E4M3_16((b) + 32), E4M3_16((b) + 48)
static const float E4M3_LUT[256] = {E4M3_64(0u), E4M3_64(64u), E4M3_64(128u), E4M3_64(192u)};

/* One call's operands, shared by every kernel. */
struct gemm_args {
    const struct weight *w;
    const float *x; /* (m, ldx) */
    float *y;       /* (m, ldy) */
    size_t ldx, ldy;
    int64_t m, n, k;  /* x rows, W rows, W cols */
    size_t row_bytes; /* bytes of one W data row */
    int64_t n_kb;     /* FP8_BLOCK: scale columns, ceil(k / 128) */
};

static bool g_force_scalar;

void cpu_gemm_force_scalar(bool on)
{
    g_force_scalar = on;
}

static inline int64_t min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static inline const void *row_ptr(const struct gemm_args *a, int64_t n)
{
    return (const uint8_t *)a->w->data + (size_t)n * a->row_bytes;
}

static inline float fp8_scale(const struct gemm_args *a, int64_t n, int64_t k)
{
    return ((const float *)a->w->scale)[(size_t)(n / 128) * (size_t)a->n_kb + (size_t)(k / 128)];
}

/* The e4m3 block scale as f32, without scale2. */
static inline float nvfp4_scale(const struct gemm_args *a, int64_t n, int64_t k)
{
    const uint8_t *s = (const uint8_t *)a->w->scale;
    return E4M3_LUT[s[(size_t)n * (size_t)(a->k / 16) + (size_t)(k / 16)]];
}

/* W[n, k0 .. k0+len) -> dst[0], dst[stride], ... */
static void decode_row(const struct gemm_args *a, int64_t n, int64_t k0, int64_t len, float *dst,
                       size_t stride)
{
    const void *row = row_ptr(a, n);
    switch (a->w->format) {
    case WEIGHT_F32: {
        const float *s = (const float *)row + k0;
        for (int64_t t = 0; t < len; t++)
            dst[(size_t)t * stride] = s[t];
        break;
    }
    case WEIGHT_BF16: {
        const uint16_t *s = (const uint16_t *)row + k0;
        for (int64_t t = 0; t < len; t++)
            dst[(size_t)t * stride] = bf16_to_f32(s[t]);
        break;
    }
    case WEIGHT_F16: {
        const uint16_t *s = (const uint16_t *)row + k0;
        for (int64_t t = 0; t < len; t++)
            dst[(size_t)t * stride] = f16_to_f32(s[t]);
        break;
    }
    case WEIGHT_FP8_BLOCK: {
        const uint8_t *s = (const uint8_t *)row;
        for (int64_t k = k0; k < k0 + len;) { /* one scale per 128-column block */
            const int64_t end = min_i64((k / 128 + 1) * 128, k0 + len);
            const float sc = fp8_scale(a, n, k);
            for (; k < end; k++)
                dst[(size_t)(k - k0) * stride] = E4M3_LUT[s[k]] * sc;
        }
        break;
    }
    case WEIGHT_NVFP4: { /* k0 and len are even: whole bytes */
        static const float E2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                       -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
        const uint8_t *s = (const uint8_t *)row;
        const float scale2 = a->w->scale2;
        for (int64_t k = k0; k < k0 + len; k += 2) {
            const float sc = nvfp4_scale(a, n, k);
            const uint8_t b = s[k / 2];
            dst[(size_t)(k - k0) * stride] = E2M1[b & 15] * sc * scale2;
            dst[(size_t)(k - k0 + 1) * stride] = E2M1[b >> 4] * sc * scale2;
        }
        break;
    }
    case WEIGHT_FORMAT_COUNT: PANIC("cpu_gemm: bad weight format");
    }
}

/* ---- panel algorithm: driver shared by the portable and AVX2 kernels ---- */

struct panel_kernels {
    int mr; /* x rows per micro-tile */
    /* W rows [n0, n0+PANEL_N) x cols [kc0, kc0+kc) -> panel[k][PANEL_N], rows past n as 0 */
    void (*pack)(const struct gemm_args *a, int64_t n0, int64_t kc0, int64_t kc, float *panel);
    /* y[i][c] (=|+=) sum_k x[i][k] * panel[k][c] for i < mr, c < nvalid;
     * first: y = acc + bias (bias may be NULL); else y += acc */
    void (*micro)(int mr, const float *x, size_t ldx, const float *panel, int64_t kc, float *y,
                  size_t ldy, int nvalid, const float *bias, bool first);
};

/* Rows per work item: the multiple of PANEL_N up to ITEM_N_MAX whose slowest
 * thread has the fewest rows (N = 576 on 2 threads: 48 rows, 6 items each,
 * rather than 64 rows, where one thread gets 5 items and the other 4). */
static int64_t panel_item_rows(int64_t n, int threads)
{
    int64_t best = PANEL_N, best_cost = INT64_MAX;
    for (int64_t r = ITEM_N_MAX; r >= PANEL_N; r -= PANEL_N) {
        int64_t items = (n + r - 1) / r;
        int64_t cost = (items + threads - 1) / threads * r;
        if (cost < best_cost) {
            best = r;
            best_cost = cost;
        }
    }
    return best;
}

static void panel_run(const struct gemm_args *a, const struct panel_kernels *pk)
{
    const bool parallel = (double)a->m * (double)a->n * (double)a->k >= MIN_PARALLEL_MACS;
    const int64_t item_n = panel_item_rows(a->n, parallel ? omp_get_max_threads() : 1);
    const int64_t items = (a->n + item_n - 1) / item_n;
    const float *bias = a->w->bias;

#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t it = 0; it < items; it++) {
        _Alignas(64) float panel[ITEM_N_MAX * KC]; /* (item_n / PANEL_N) panels of [KC][PANEL_N] */
        const int64_t n0 = it * item_n;
        const int64_t n_end = min_i64(n0 + item_n, a->n);
        for (int64_t kc0 = 0; kc0 < a->k; kc0 += KC) {
            const int64_t kc = min_i64(KC, a->k - kc0);
            const bool first = kc0 == 0;
            for (int64_t p = n0; p < n_end; p += PANEL_N)
                pk->pack(a, p, kc0, kc, panel + (p - n0) * KC);
            for (int64_t i = 0; i < a->m; i += pk->mr) {
                const int mr = (int)min_i64(pk->mr, a->m - i);
                const float *xi = a->x + (size_t)i * a->ldx + (size_t)kc0;
                for (int64_t p = n0; p < n_end; p += PANEL_N) {
                    pk->micro(mr, xi, a->ldx, panel + (p - n0) * KC, kc,
                              a->y + (size_t)i * a->ldy + (size_t)p, a->ldy,
                              (int)min_i64(PANEL_N, n_end - p), bias ? bias + p : NULL, first);
                }
            }
        }
    }
}

static inline void tile_store(const float *acc, float *yr, int nvalid, const float *bias, bool first)
{
    for (int c = 0; c < nvalid; c++)
        yr[c] = first ? acc[c] + (bias ? bias[c] : 0.0f) : yr[c] + acc[c];
}

/* ---- portable kernels ---- */

/* Rows [n0, n0+width) into panel columns; rows at or past a->n become zeros. */
static void pack_rows_portable(const struct gemm_args *a, int64_t n0, int width, int64_t kc0,
                               int64_t kc, float *dst)
{
    for (int j = 0; j < width; j++) {
        if (n0 + j < a->n) {
            decode_row(a, n0 + j, kc0, kc, dst + j, PANEL_N);
        } else {
            for (int64_t k = 0; k < kc; k++)
                dst[k * PANEL_N + j] = 0.0f;
        }
    }
}

static void pack_portable(const struct gemm_args *a, int64_t n0, int64_t kc0, int64_t kc,
                          float *panel)
{
    pack_rows_portable(a, n0, PANEL_N, kc0, kc, panel);
}

/* Written with GCC/clang vector types (SSE2 on baseline x86-64, NEON on
 * arm64) because auto-vectorisers turn the plain loop nest inside out. MR is a
 * constant at each call so the 2 x 4 accumulators stay in registers. */
typedef float v4f __attribute__((vector_size(16)));

static inline void micro_portable_mr(int MR, const float *x, size_t ldx, const float *panel,
                                     int64_t kc, float *y, size_t ldy, int nvalid,
                                     const float *bias, bool first)
{
    v4f acc[MR_PORTABLE][PANEL_N / 4];
    memset(acc, 0, sizeof(acc));
    for (int64_t k = 0; k < kc; k++) {
        v4f p[PANEL_N / 4];
        memcpy(p, panel + k * PANEL_N, sizeof(p));
        for (int i = 0; i < MR; i++) {
            const float xs = x[(size_t)i * ldx + (size_t)k];
            const v4f xv = {xs, xs, xs, xs};
            for (int c = 0; c < PANEL_N / 4; c++)
                acc[i][c] += xv * p[c];
        }
    }
    for (int i = 0; i < MR; i++) {
        float t[PANEL_N];
        memcpy(t, acc[i], sizeof(t));
        tile_store(t, y + (size_t)i * ldy, nvalid, bias, first);
    }
}

static void micro_portable(int mr, const float *x, size_t ldx, const float *panel, int64_t kc,
                           float *y, size_t ldy, int nvalid, const float *bias, bool first)
{
    _Static_assert(MR_PORTABLE == 2, "one case per micro-tile height");
    if (mr == 2)
        micro_portable_mr(2, x, ldx, panel, kc, y, ldy, nvalid, bias, first);
    else
        micro_portable_mr(1, x, ldx, panel, kc, y, ldy, nvalid, bias, first);
}

static const struct panel_kernels PANEL_PORTABLE = {MR_PORTABLE, pack_portable, micro_portable};

/* ---- AVX2 + FMA + F16C kernels ---- */
#if CPU_GEMM_X86

/* W[n, k] as fp32, one element: for the K tails of the AVX2 kernels. */
static inline float w_at(const struct gemm_args *a, int64_t n, int64_t k)
{
    const void *row = row_ptr(a, n);
    switch (a->w->format) {
    case WEIGHT_F32: return ((const float *)row)[k];
    case WEIGHT_BF16: return bf16_to_f32(((const uint16_t *)row)[k]);
    case WEIGHT_F16: return f16_to_f32(((const uint16_t *)row)[k]);
    case WEIGHT_FP8_BLOCK: return E4M3_LUT[((const uint8_t *)row)[k]] * fp8_scale(a, n, k);
    case WEIGHT_NVFP4: {
        uint8_t b = ((const uint8_t *)row)[k / 2];
        /* e2m1 * e4m3 is exact in f32; scale2 is the one rounding */
        return e2m1_to_f32((k & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15)) * nvfp4_scale(a, n, k) *
               a->w->scale2;
    }
    case WEIGHT_FORMAT_COUNT: break;
    }
    PANIC("cpu_gemm: bad weight format %d", (int)a->w->format);
}

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
/* Loops over the register tile must unroll fully, or the accumulator arrays
 * are kept in memory and stored on every iteration. */
#if defined(__clang__)
#define UNROLL _Pragma("unroll")
#else
#define UNROLL _Pragma("GCC unroll 16")
#endif
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* Decoders: W[row][k .. k+16) -> two vectors of 8 fp32, k a multiple of 16.
 * They avoid vector shifts where they can (one shift unit on some cores) and
 * never feed f32 subnormals to arithmetic (a microcode assist on some cores,
 * which halved fp8 speed here): small codes go through F16C instead. */

/* 8 bf16 -> f32 by placing each 16-bit word in the top half of a 32-bit lane:
 * the same 16 bytes in both 128-bit lanes, one byte shuffle, no shift. */
AVX2_INLINE __m256 bf16x8(const uint16_t *p)
{
    const __m256i place = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                           -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(v, place));
}

AVX2_INLINE void ld16_bf16(const uint16_t *p, __m256 *w0, __m256 *w1)
{
    *w0 = bf16x8(p);
    *w1 = bf16x8(p + 8);
}

AVX2_INLINE void ld16_f16(const uint16_t *p, __m256 *w0, __m256 *w1)
{
    *w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    *w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
}

/* 8 E4M3 codes, as the high bytes of 8 words, -> f32 * 2^-8. An arithmetic
 * shift by one turns S.EEEE.MMM into the f16 S.0EEEE.MMM0000000 once the
 * duplicated sign (bit 14) is cleared: the same number with f16's bias 15
 * instead of 7, i.e. 2^-8 times the E4M3 value, subnormals included, which
 * F16C converts exactly. The NaN codes (magnitude 0x7f) come out as 1.875
 * (480 * 2^-8) here; see ld16_e4m3. */
AVX2_INLINE __m256 e4m3x8_hi(__m128i w, bool exact_nan)
{
    __m128i h = _mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16((short)0xbfff));
    if (exact_nan) {
        const __m128i nan_code = _mm_set1_epi16(0x7f00);
        h = _mm_or_si128(h, _mm_cmpeq_epi16(_mm_and_si128(w, nan_code), nan_code)); /* all ones */
    }
    return _mm256_cvtph_ps(h);
}

/* Results are W * 2^-8: s is the block scale, the caller owes a factor 256.
 * NaN codes: with nan_seen NULL each one decodes to NaN; otherwise they decode
 * finite and *nan_seen, the bytewise max of the magnitudes, reaches 0x7f. That
 * is 2 instructions per 16 codes instead of 6 (25% faster decode); the caller
 * rescans its rows only when it sees 0x7f. */
AVX2_INLINE void ld16_e4m3(const uint8_t *p, __m256 s, __m256 *w0, __m256 *w1, __m128i *nan_seen)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m128i z = _mm_setzero_si128();
    if (nan_seen)
        *nan_seen = _mm_max_epu8(*nan_seen, _mm_and_si128(v, _mm_set1_epi8(0x7f)));
    *w0 = _mm256_mul_ps(e4m3x8_hi(_mm_unpacklo_epi8(z, v), !nan_seen), s);
    *w1 = _mm256_mul_ps(e4m3x8_hi(_mm_unpackhi_epi8(z, v), !nan_seen), s);
}

/* Whether any of the len E4M3 codes at p is a NaN. */
static bool e4m3_has_nan(const uint8_t *p, int64_t len)
{
    for (int64_t t = 0; t < len; t++)
        if ((p[t] & 0x7f) == 0x7f)
            return true;
    return false;
}

/* 16 E2M1 codes (8 bytes, element 2i in the low nibble of byte i). Every
 * E2M1 value is an f16 whose low byte is zero, so one byte shuffle maps a
 * code to its f16 high byte; F16C converts, and the block scale multiplies. */
AVX2_INLINE void ld16_e2m1(const uint8_t *p, __m256 s, __m256 *w0, __m256 *w1)
{
    /* f16 high bytes of 0, .5, 1, 1.5, 2, 3, 4, 6, then the same negated */
    const __m128i lut = _mm_setr_epi8(0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46, (char)0x80,
                                      (char)0xb8, (char)0xbc, (char)0xbe, (char)0xc0, (char)0xc2,
                                      (char)0xc4, (char)0xc6);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    int64_t q;
    memcpy(&q, p, 8);
    const __m128i v = _mm_cvtsi64_si128(q);
    const __m128i codes =
        _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    const __m128i hi = _mm_shuffle_epi8(lut, codes);
    const __m128i z = _mm_setzero_si128();
    *w0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpacklo_epi8(z, hi)), s);
    *w1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpackhi_epi8(z, hi)), s);
}

/* Where a row's block scales start (fp8, nvfp4; NULL for unscaled formats). */
AVX2_INLINE const void *scale_row(const struct gemm_args *a, enum weight_format fmt, int64_t n)
{
    if (fmt == WEIGHT_FP8_BLOCK)
        return (const float *)a->w->scale + (size_t)(n / 128) * (size_t)a->n_kb;
    if (fmt == WEIGHT_NVFP4)
        return (const uint8_t *)a->w->scale + (size_t)n * (size_t)(a->k / 16);
    return NULL;
}

/* The block scale ld16 multiplies by for the block holding column k. */
AVX2_INLINE __m256 block_scale(enum weight_format fmt, const void *srow, int64_t k)
{
    if (fmt == WEIGHT_FP8_BLOCK)
        return _mm256_broadcast_ss((const float *)srow + ((size_t)k >> 7));
    if (fmt == WEIGHT_NVFP4)
        return _mm256_broadcast_ss(&E4M3_LUT[((const uint8_t *)srow)[(size_t)k >> 4]]);
    return _mm256_setzero_ps();
}

/* What ld16's values still owe W, applied once per output (fused path) or
 * per panel element (pack): 2^8 for fp8 (see ld16_e4m3), scale2 for nvfp4. */
AVX2_INLINE float decode_factor(const struct gemm_args *a, enum weight_format fmt)
{
    return fmt == WEIGHT_FP8_BLOCK ? 256.0f : fmt == WEIGHT_NVFP4 ? a->w->scale2 : 1.0f;
}

/* W[row][k .. k+16) as fp32 / decode_factor(), k a multiple of 16;
 * nan_seen as for ld16_e4m3 (other formats ignore it). */
AVX2_INLINE void ld16(enum weight_format fmt, const void *row, int64_t k, __m256 s, __m256 *w0,
                      __m256 *w1, __m128i *nan_seen)
{
    switch (fmt) {
    case WEIGHT_F32:
        *w0 = _mm256_loadu_ps((const float *)row + k);
        *w1 = _mm256_loadu_ps((const float *)row + k + 8);
        return;
    case WEIGHT_BF16: ld16_bf16((const uint16_t *)row + k, w0, w1); return;
    case WEIGHT_F16: ld16_f16((const uint16_t *)row + k, w0, w1); return;
    case WEIGHT_FP8_BLOCK: ld16_e4m3((const uint8_t *)row + k, s, w0, w1, nan_seen); return;
    case WEIGHT_NVFP4: ld16_e2m1((const uint8_t *)row + k / 2, s, w0, w1); return;
    case WEIGHT_FORMAT_COUNT: break;
    }
    *w0 = *w1 = _mm256_setzero_ps();
}

AVX2_INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Fused tile: W rows [n, n+R) x x rows [i, i+M), full K, written to y.
 * Instantiated with constant fmt, R, M so the loops unroll and acc stays in
 * registers. */
AVX2_INLINE void fused_tile(const struct gemm_args *a, enum weight_format fmt, int R, int M,
                            int64_t n, int64_t i)
{
    const int64_t K = a->k, K16 = K & ~(int64_t)15;
    /* scale block: the inner loop never crosses one */
    const int64_t bk = fmt == WEIGHT_FP8_BLOCK ? 128 : fmt == WEIGHT_NVFP4 ? 16 : K16;
    const void *row[FUSED_R], *srow[FUSED_R];
    const float *xr[FUSED_M];
    __m256 acc[FUSED_R][FUSED_M];
    UNROLL
    for (int r = 0; r < R; r++) {
        row[r] = row_ptr(a, n + r);
        srow[r] = scale_row(a, fmt, n + r);
        UNROLL
        for (int j = 0; j < M; j++)
            acc[r][j] = _mm256_setzero_ps();
    }
    UNROLL
    for (int j = 0; j < M; j++)
        xr[j] = a->x + (size_t)(i + j) * a->ldx;
    __m128i nan_seen = _mm_setzero_si128();

    for (int64_t k0 = 0; k0 < K16; k0 += bk) {
        const int64_t k1 = min_i64(k0 + bk, K16);
        __m256 s[FUSED_R];
        UNROLL
        for (int r = 0; r < R; r++)
            s[r] = block_scale(fmt, srow[r], k0);
        for (int64_t k = k0; k < k1; k += 16) {
            __m256 x0[FUSED_M], x1[FUSED_M];
            UNROLL
            for (int j = 0; j < M; j++) {
                x0[j] = _mm256_loadu_ps(xr[j] + k);
                x1[j] = _mm256_loadu_ps(xr[j] + k + 8);
            }
            UNROLL
            for (int r = 0; r < R; r++) {
                __m256 w0, w1;
                ld16(fmt, row[r], k, s[r], &w0, &w1, &nan_seen);
                UNROLL
                for (int j = 0; j < M; j++) {
                    acc[r][j] = _mm256_fmadd_ps(w0, x0[j], acc[r][j]);
                    acc[r][j] = _mm256_fmadd_ps(w1, x1[j], acc[r][j]);
                }
            }
        }
    }

    bool nan_row[FUSED_R] = {false};
    if (fmt == WEIGHT_FP8_BLOCK &&
        _mm_movemask_epi8(_mm_cmpeq_epi8(nan_seen, _mm_set1_epi8(0x7f))) != 0) {
        UNROLL
        for (int r = 0; r < R; r++)
            nan_row[r] = e4m3_has_nan(row[r], K16);
    }

    const float *bias = a->w->bias;
    const float factor = decode_factor(a, fmt);
    UNROLL
    for (int r = 0; r < R; r++) {
        UNROLL
        for (int j = 0; j < M; j++) {
            float sum = nan_row[r] ? NAN : hsum8(acc[r][j]) * factor;
            for (int64_t k = K16; k < K; k++)
                sum += w_at(a, n + r, k) * xr[j][k];
            if (bias)
                sum += bias[n + r];
            a->y[(size_t)(i + j) * a->ldy + (size_t)(n + r)] = sum;
        }
    }
}

typedef void (*fused_tile_fn)(const struct gemm_args *a, int64_t n, int64_t i);

#define FUSED_FN(FMT, tag, R, M)                                                                   \
    AVX2_FN static void fused_##tag##_r##R##_m##M(const struct gemm_args *a, int64_t n, int64_t i) \
    {                                                                                              \
        fused_tile(a, FMT, R, M, n, i);                                                            \
    }
#define FUSED_FNS(FMT, tag)                                                                        \
    FUSED_FN(FMT, tag, 4, 1)                                                                       \
    FUSED_FN(FMT, tag, 4, 2)                                                                       \
    FUSED_FN(FMT, tag, 2, 3)                                                                       \
    FUSED_FN(FMT, tag, 2, 4)                                                                       \
    FUSED_FN(FMT, tag, 1, 1)                                                                       \
    FUSED_FN(FMT, tag, 1, 2)                                                                       \
    FUSED_FN(FMT, tag, 1, 3)                                                                       \
    FUSED_FN(FMT, tag, 1, 4)
#define FUSED_ROW(tag)                                                                             \
    {                                                                                              \
        .wide = {NULL, fused_##tag##_r4_m1, fused_##tag##_r4_m2, fused_##tag##_r2_m3,              \
                 fused_##tag##_r2_m4},                                                             \
        .one = {NULL, fused_##tag##_r1_m1, fused_##tag##_r1_m2, fused_##tag##_r1_m3,               \
                fused_##tag##_r1_m4},                                                              \
    }

FUSED_FNS(WEIGHT_F32, f32)
FUSED_FNS(WEIGHT_BF16, bf16)
FUSED_FNS(WEIGHT_F16, f16)
FUSED_FNS(WEIGHT_FP8_BLOCK, fp8)
FUSED_FNS(WEIGHT_NVFP4, nvfp4)

/* Per format, indexed by the x rows of a pass (1..FUSED_M): wide tiles cover
 * FUSED_WIDE_R(M) W rows, one-row tiles the rest of a short group. Fewer W
 * rows when more x rows, so that R * M accumulators fit the 16 ymm registers. */
#define FUSED_WIDE_R(M) ((M) <= 2 ? 4 : 2)
struct fused_tiles {
    fused_tile_fn wide[FUSED_M + 1];
    fused_tile_fn one[FUSED_M + 1];
};
static const struct fused_tiles FUSED_TILES[WEIGHT_FORMAT_COUNT] = {
    [WEIGHT_F32] = FUSED_ROW(f32),         [WEIGHT_BF16] = FUSED_ROW(bf16),
    [WEIGHT_F16] = FUSED_ROW(f16),         [WEIGHT_FP8_BLOCK] = FUSED_ROW(fp8),
    [WEIGHT_NVFP4] = FUSED_ROW(nvfp4),
};

static void fused_run(const struct gemm_args *a)
{
    const struct fused_tiles *tiles = &FUSED_TILES[a->w->format];
    const int64_t groups = (a->n + FUSED_R - 1) / FUSED_R;
    const bool parallel = (double)a->m * (double)a->n * (double)a->k >= MIN_PARALLEL_MACS;

    /* static: each thread streams one contiguous slice of W, which the
     * hardware prefetchers follow best */
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t n0 = g * FUSED_R;
        const int64_t n_end = min_i64(n0 + FUSED_R, a->n);
        for (int64_t i = 0; i < a->m; i += FUSED_M) {
            const int mm = (int)min_i64(FUSED_M, a->m - i);
            const int64_t wr = FUSED_WIDE_R(mm);
            int64_t n = n0;
            for (; n + wr <= n_end; n += wr)
                tiles->wide[mm](a, n, i);
            for (; n < n_end; n++)
                tiles->one[mm](a, n, i);
        }
    }
}

AVX2_INLINE void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    UNROLL
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    UNROLL
    for (int j = 0; j < 8; j += 4) {
        u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
        u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xee);
        u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xee);
    }
    UNROLL
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
        r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
    }
}

/* Panel pack: 8 rows x 16 columns are converted in registers, transposed as
 * two 8 x 8 blocks and stored as 16 panel lines; partial row groups and K
 * tails go through the scalar decoder. */
AVX2_INLINE void pack_avx2(const struct gemm_args *a, enum weight_format fmt, int64_t n0,
                           int64_t kc0, int64_t kc, float *panel)
{
    const __m256 factor = _mm256_set1_ps(decode_factor(a, fmt));
    for (int h = 0; h < PANEL_N; h += 8) {
        const int64_t nh = n0 + h;
        float *dst = panel + h;
        if (nh + 8 > a->n) {
            pack_rows_portable(a, nh, 8, kc0, kc, dst);
            continue;
        }
        const void *row[8], *srow[8];
        UNROLL
        for (int j = 0; j < 8; j++) {
            row[j] = row_ptr(a, nh + j);
            srow[j] = scale_row(a, fmt, nh + j);
        }
        int64_t k = 0;
        for (; k + 16 <= kc; k += 16) {
            __m256 v0[8], v1[8];
            UNROLL
            for (int j = 0; j < 8; j++) {
                ld16(fmt, row[j], kc0 + k, block_scale(fmt, srow[j], kc0 + k), &v0[j], &v1[j],
                     NULL);
                if (fmt == WEIGHT_FP8_BLOCK || fmt == WEIGHT_NVFP4) {
                    v0[j] = _mm256_mul_ps(v0[j], factor);
                    v1[j] = _mm256_mul_ps(v1[j], factor);
                }
            }
            transpose8(v0);
            transpose8(v1);
            UNROLL
            for (int j = 0; j < 8; j++) {
                _mm256_store_ps(dst + (k + j) * PANEL_N, v0[j]);
                _mm256_store_ps(dst + (k + 8 + j) * PANEL_N, v1[j]);
            }
        }
        for (; k < kc; k++)
            UNROLL
            for (int j = 0; j < 8; j++)
                dst[k * PANEL_N + j] = w_at(a, nh + j, kc0 + k);
    }
}

#define PACK_FN(FMT, tag)                                                                          \
    AVX2_FN static void pack_##tag(const struct gemm_args *a, int64_t n0, int64_t kc0, int64_t kc, \
                                   float *panel)                                                   \
    {                                                                                              \
        pack_avx2(a, FMT, n0, kc0, kc, panel);                                                     \
    }
PACK_FN(WEIGHT_F32, f32)
PACK_FN(WEIGHT_BF16, bf16)
PACK_FN(WEIGHT_F16, f16)
PACK_FN(WEIGHT_FP8_BLOCK, fp8)
PACK_FN(WEIGHT_NVFP4, nvfp4)

AVX2_INLINE void micro_avx2_mr(int MR, const float *x, size_t ldx, const float *panel, int64_t kc,
                               float *y, size_t ldy, int nvalid, const float *bias, bool first)
{
    __m256 c0[MR_AVX2], c1[MR_AVX2];
    const float *xr[MR_AVX2];
    UNROLL
    for (int i = 0; i < MR; i++) {
        c0[i] = _mm256_setzero_ps();
        c1[i] = _mm256_setzero_ps();
        xr[i] = x + (size_t)i * ldx;
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(panel + k * PANEL_N);
        const __m256 b1 = _mm256_load_ps(panel + k * PANEL_N + 8);
        UNROLL
        for (int i = 0; i < MR; i++) {
            const __m256 xv = _mm256_broadcast_ss(xr[i] + k);
            c0[i] = _mm256_fmadd_ps(xv, b0, c0[i]);
            c1[i] = _mm256_fmadd_ps(xv, b1, c1[i]);
        }
    }
    UNROLL
    for (int i = 0; i < MR; i++) {
        float *yr = y + (size_t)i * ldy;
        if (nvalid == PANEL_N) {
            __m256 v0 = c0[i], v1 = c1[i];
            if (!first) {
                v0 = _mm256_add_ps(_mm256_loadu_ps(yr), v0);
                v1 = _mm256_add_ps(_mm256_loadu_ps(yr + 8), v1);
            } else if (bias) {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(bias));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(bias + 8));
            }
            _mm256_storeu_ps(yr, v0);
            _mm256_storeu_ps(yr + 8, v1);
        } else {
            float t[PANEL_N];
            _mm256_storeu_ps(t, c0[i]);
            _mm256_storeu_ps(t + 8, c1[i]);
            tile_store(t, yr, nvalid, bias, first);
        }
    }
}

AVX2_FN static void micro_avx2(int mr, const float *x, size_t ldx, const float *panel, int64_t kc,
                               float *y, size_t ldy, int nvalid, const float *bias, bool first)
{
    switch (mr) {
    case 1: micro_avx2_mr(1, x, ldx, panel, kc, y, ldy, nvalid, bias, first); break;
    case 2: micro_avx2_mr(2, x, ldx, panel, kc, y, ldy, nvalid, bias, first); break;
    case 3: micro_avx2_mr(3, x, ldx, panel, kc, y, ldy, nvalid, bias, first); break;
    case 4: micro_avx2_mr(4, x, ldx, panel, kc, y, ldy, nvalid, bias, first); break;
    case 5: micro_avx2_mr(5, x, ldx, panel, kc, y, ldy, nvalid, bias, first); break;
    case 6: micro_avx2_mr(6, x, ldx, panel, kc, y, ldy, nvalid, bias, first); break;
    default: PANIC("cpu_gemm: micro-tile of %d rows", mr);
    }
}

static const struct panel_kernels PANEL_AVX2[WEIGHT_FORMAT_COUNT] = {
    [WEIGHT_F32] = {MR_AVX2, pack_f32, micro_avx2},
    [WEIGHT_BF16] = {MR_AVX2, pack_bf16, micro_avx2},
    [WEIGHT_F16] = {MR_AVX2, pack_f16, micro_avx2},
    [WEIGHT_FP8_BLOCK] = {MR_AVX2, pack_fp8, micro_avx2},
    [WEIGHT_NVFP4] = {MR_AVX2, pack_nvfp4, micro_avx2},
};

/* __builtin_cpu_supports checks OS support for the ymm state too; F16C is
 * read from CPUID because not every compiler knows the name "f16c". Cached
 * because CPUID traps to the hypervisor in a VM. */
static bool cpu_has_avx2(void)
{
    static atomic_int cached = -1; /* racing first calls all store the same value */
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        unsigned eax, ebx, ecx, edx;
        bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
        v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}
#endif /* CPU_GEMM_X86 */

void cpu_gemm(const struct weight *w, const float *x, int m, size_t ldx, float *y, size_t ldy)
{
    cpu_gemm_mode(w, x, m, ldx, y, ldy, false);
}

void cpu_gemm_mode(const struct weight *w, const float *x, int m, size_t ldx, float *y, size_t ldy, bool rowwise)
{
    ASSERT(w != NULL && m >= 0);
    ASSERT((unsigned)w->format < WEIGHT_FORMAT_COUNT && w->rows >= 0 && w->cols >= 0);
    if (m == 0 || w->rows == 0)
        return;
    ASSERT(x != NULL && y != NULL && ldx >= (size_t)w->cols && ldy >= (size_t)w->rows);
    ASSERT(w->data != NULL || w->cols == 0);
    if (w->format == WEIGHT_FP8_BLOCK || w->format == WEIGHT_NVFP4)
        ASSERT(w->scale != NULL || w->cols == 0);
    if (w->format == WEIGHT_NVFP4)
        ASSERT(w->cols % 16 == 0);

    static const size_t ELEM_BITS[WEIGHT_FORMAT_COUNT] = {
        [WEIGHT_F32] = 32, [WEIGHT_BF16] = 16, [WEIGHT_F16] = 16, [WEIGHT_FP8_BLOCK] = 8,
        [WEIGHT_NVFP4] = 4,
    };
    const struct gemm_args a = {
        .w = w,
        .x = x,
        .y = y,
        .ldx = ldx,
        .ldy = ldy,
        .m = m,
        .n = w->rows,
        .k = w->cols,
        .row_bytes = (size_t)w->cols * ELEM_BITS[w->format] / 8,
        .n_kb = (w->cols + 127) / 128,
    };

    if (a.k == 0) { /* empty sum: the panel loop would never store */
        for (int64_t i = 0; i < a.m; i++)
            for (int64_t n = 0; n < a.n; n++)
                y[(size_t)i * ldy + (size_t)n] = w->bias ? w->bias[n] : 0.0f;
        return;
    }
#if CPU_GEMM_X86
    if (!g_force_scalar && cpu_has_avx2()) {
        /* fused_tile sums each (row, feature) in one order for any row grouping; the panel path in another */
        if (a.m <= FUSED_M_MAX || rowwise)
            fused_run(&a);
        else
            panel_run(&a, &PANEL_AVX2[w->format]);
        return;
    }
#endif
    panel_run(&a, &PANEL_PORTABLE);
}
