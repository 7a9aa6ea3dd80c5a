/* caps_table.c — THE compute capability -> instruction features table.
 *
 * The only file in src/ that compares compute capabilities (STYLE.md rule
 * 13; tests/cli/no_cc_gates.sh enforces it). Everything else reads the
 * booleans, the arch name and the per-SM rates this file puts into struct
 * device_caps. Rows follow ../shared/spec/devices.md; a cc not in the table
 * (newer, or older than 8.0) gets portable features only (fp32 FMA kernels),
 * known_cc = false, and plan_caps_table_warning() says why.
 *
 * Deliberately not here: anything measured (SM count, bandwidth, clocks come
 * from the probe or the profile) and which fatbin variants actually load
 * (the backend refines that through plan_request.variant_loads).
 *
 * Per-SM rates are dense FLOP per clock per SM, leads derived from public
 * datasheet peaks (peak / (SMs x boost clock)), not measurements:
 *   sm_80  A100: bf16 mma 312 TF / (108 x 1.41 GHz) = 2048; fp32 64 lanes x 2 = 128
 *   sm_86  A6000: bf16 mma 155 TF / (84 x 1.80) = 1024; fp32 128 lanes x 2 = 256
 *   sm_89  L40S: bf16 362 TF / (142 x 2.52) = 1024; fp8 mma 2048
 *   sm_90  H100: wgmma bf16 989 TF / (132 x 1.83) = 4096, fp8 wgmma 8192; mma.sync reaches
 *          about half of wgmma on Hopper (lead): bf16 mma 2048, fp8 mma 4096
 *   sm_100 B200: tcgen05 bf16 2.25 PF / (148 x 1.965) ~ 8192, fp4 9 PF -> 32768;
 *          legacy mma.sync taken as 2048 bf16 / 4096 fp8 (lead)
 *   sm_120 RTX PRO 6000: fp4 block-scaled 2 PF / (188 x 2.6) = 4096, fp8 2048, bf16 1024
 */
#include <stdio.h>
#include <string.h>

#include "plan/plan.h"

struct caps_row {
    int major, minor;
    const char *arch;
    bool bf16_mma, fp8_mma, wgmma, tcgen05, fp4_mma_block_scaled, tma, pdl, clusters;
    size_t smem_per_block_optin, smem_per_sm;
    /* fp32_fma, bf16_mma, bf16_wgmma, bf16_tcgen05, fp8_mma, fp8_wgmma, fp4_bs_mma, fp4_tcgen05 */
    double rate[PLAN_MATH_COUNT];
};

/* clang-format off */
static const struct caps_row CAPS_TABLE[] = {
    /* cc     arch       bf16  fp8    wgmma  tcgen05 fp4bs  tma    pdl    clust  optin   per SM   rates (see struct caps_row) */
    {8, 0,  "sm_80",   true, false, false, false, false, false, false, false, 166912, 167936, {128, 2048, 0,    0,    0,    0,    0,    0}},
    {8, 6,  "sm_86",   true, false, false, false, false, false, false, false, 101376, 102400, {256, 1024, 0,    0,    0,    0,    0,    0}},
    {8, 9,  "sm_89",   true, true,  false, false, false, false, false, false, 101376, 102400, {256, 1024, 0,    0,    2048, 0,    0,    0}},
    {9, 0,  "sm_90a",  true, true,  true,  false, false, true,  true,  true,  232448, 233472, {256, 2048, 4096, 0,    4096, 8192, 0,    0}},
    {10, 0, "sm_100a", true, true,  false, true,  false, true,  true,  true,  232448, 233472, {256, 2048, 0,    8192, 4096, 0,    0,    32768}},
    {10, 3, "sm_100a", true, true,  false, true,  false, true,  true,  true,  232448, 233472, {256, 2048, 0,    8192, 4096, 0,    0,    32768}},
    {12, 0, "sm_120a", true, true,  false, false, true,  true,  true,  true,  101376, 102400, {256, 1024, 0,    0,    2048, 0,    4096, 0}},
    {12, 1, "sm_120a", true, true,  false, false, true,  true,  true,  true,  101376, 102400, {256, 1024, 0,    0,    2048, 0,    4096, 0}},
};
/* clang-format on */
#define CAPS_TABLE_N (sizeof CAPS_TABLE / sizeof CAPS_TABLE[0])

/* What an unknown device is assumed to run: fp32 FMA at 128 lanes per SM. */
#define PORTABLE_FP32_RATE 256.0

static const struct caps_row *caps_table_find(int major, int minor)
{
    for (size_t i = 0; i < CAPS_TABLE_N; i++)
        if (CAPS_TABLE[i].major == major && CAPS_TABLE[i].minor == minor)
            return &CAPS_TABLE[i];
    return NULL;
}

bool plan_caps_apply_table(struct device_caps *caps)
{
    const struct caps_row *r = caps_table_find(caps->cc_major, caps->cc_minor);
    caps->known_cc = r != NULL;
    memset(caps->flops_per_clk_sm, 0, sizeof caps->flops_per_clk_sm);
    if (!r) {
        caps->bf16_mma = caps->fp8_mma = caps->wgmma = caps->tcgen05 = false;
        caps->fp4_mma_block_scaled = caps->tma = caps->pdl = caps->clusters = false;
        caps->arch[0] = 0;
        caps->flops_per_clk_sm[PLAN_MATH_FP32_FMA] = PORTABLE_FP32_RATE;
        /* smem stays whatever the probe found; a profile of an unknown cc has none. */
        return false;
    }
    snprintf(caps->arch, sizeof caps->arch, "%s", r->arch);
    caps->bf16_mma = r->bf16_mma;
    caps->fp8_mma = r->fp8_mma;
    caps->wgmma = r->wgmma;
    caps->tcgen05 = r->tcgen05;
    caps->fp4_mma_block_scaled = r->fp4_mma_block_scaled;
    caps->tma = r->tma;
    caps->pdl = r->pdl;
    caps->clusters = r->clusters;
    memcpy(caps->flops_per_clk_sm, r->rate, sizeof caps->flops_per_clk_sm);
    if (!caps->smem_per_block_optin)
        caps->smem_per_block_optin = r->smem_per_block_optin;
    if (!caps->smem_per_sm)
        caps->smem_per_sm = r->smem_per_sm;
    return true;
}

void plan_caps_table_warning(const struct device_caps *caps, char *buf, size_t n)
{
    if (!n)
        return;
    buf[0] = 0;
    if (caps_table_find(caps->cc_major, caps->cc_minor))
        return;
    const struct caps_row *first = &CAPS_TABLE[0], *last = &CAPS_TABLE[CAPS_TABLE_N - 1];
    int cc = caps->cc_major * 10 + caps->cc_minor;
    const char *where = cc > last->major * 10 + last->minor     ? "newer than"
                        : cc < first->major * 10 + first->minor ? "older than"
                                                                : "a gap in";
    snprintf(buf, n,
             "compute capability %d.%d is %s the capability table (%d.%d..%d.%d): portable fp32 kernels only "
             "(tensor-core variants need an entry in plan/caps_table.c)",
             caps->cc_major, caps->cc_minor, where, first->major, first->minor, last->major, last->minor);
}
