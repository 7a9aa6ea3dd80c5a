/* profiles.c — named GPUs to plan for without having them (`--profile NAME`).
 *
 * The rows are the profiles of ../shared/spec/devices.md (datasheet
 * figures; leads, not measurements). A profile supplies what a probe would
 * measure (SMs, memory, bandwidth, L2, clock, power, links) and its compute
 * capability; the instruction features, per-SM rates and shared-memory
 * limits come from the capability table (caps_table.c), so a profile can
 * never disagree with what a probed GPU of the same cc would get.
 *
 * Deliberately not here: any feature flag or cc comparison.
 */
#include <stdio.h>
#include <string.h>

#include "plan/plan.h"

struct profile {
    const char *name;
    const char *device;
    int cc_major, cc_minor;
    int sm_count;
    double mem_gb; /* 1e9 bytes */
    double bw_tbs; /* datasheet HBM/GDDR bandwidth */
    double l2_mib;
    double clock_ghz; /* boost */
    double tdp_w;     /* 0: not published */
    bool nvlink;
};

static const struct profile PROFILES[] = {
    {"a100", "NVIDIA A100-SXM4-80GB", 8, 0, 108, 80, 2.0, 40, 1.41, 400, true},
    {"rtx-a6000", "NVIDIA RTX A6000", 8, 6, 84, 48, 0.77, 6, 1.80, 300, false},
    {"l40s", "NVIDIA L40S", 8, 9, 142, 48, 0.86, 96, 2.52, 350, false},
    {"h100", "NVIDIA H100 80GB HBM3", 9, 0, 132, 80, 3.35, 50, 1.98, 700, true},
    {"h200", "NVIDIA H200", 9, 0, 132, 141, 4.8, 60, 1.98, 700, true},
    {"b200", "NVIDIA B200", 10, 0, 148, 180, 8.0, 126, 1.965, 1000, true},
    {"rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", 12, 0, 188, 96, 1.8, 128, 2.617, 600, false},
    {"rtx-5090", "NVIDIA GeForce RTX 5090", 12, 0, 170, 32, 1.8, 96, 2.407, 575, false},
    {"dgx-spark", "NVIDIA GB10 (DGX Spark)", 12, 1, 48, 128, 0.27, 24, 2.5, 0, false},
};
#define N_PROFILES (sizeof PROFILES / sizeof PROFILES[0])

const char *plan_profile_names(void)
{
    return "a100, rtx-a6000, l40s, h100, h200, b200, rtx-pro-6000, rtx-5090, dgx-spark";
}

enum status plan_caps_from_profile(struct device_caps *caps, const char *name, struct err *err)
{
    const struct profile *p = NULL;
    for (size_t i = 0; i < N_PROFILES && !p; i++)
        if (name && strcmp(PROFILES[i].name, name) == 0)
            p = &PROFILES[i];
    if (!p)
        return err_set(err, STATUS_NOT_FOUND, "profile \"%s\" is unknown; profiles: %s",
                       name ? name : "(null)", plan_profile_names());
    memset(caps, 0, sizeof *caps);
    snprintf(caps->name, sizeof caps->name, "%s", p->device);
    snprintf(caps->source, sizeof caps->source, "profile:%s", p->name);
    caps->cc_major = p->cc_major;
    caps->cc_minor = p->cc_minor;
    caps->sm_count = p->sm_count;
    caps->total_mem = (size_t)(p->mem_gb * 1e9);
    caps->l2_bytes = (size_t)(p->l2_mib * 1048576.0);
    caps->regs_per_block = 65536;
    caps->mem_bw_gbs = p->bw_tbs * 1000.0;
    caps->power_limit_w = p->tdp_w;
    caps->nvlink = p->nvlink;
    caps->n_gpus = 1;
    caps->sm_clock_ghz = p->clock_ghz;
    plan_caps_apply_table(caps); /* every profile's cc is in the table (tests check) */
    return STATUS_OK;
}
