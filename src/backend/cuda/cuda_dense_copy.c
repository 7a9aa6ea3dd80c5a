/* cuda_dense_copy.c — resident bf16 copies of the dense NVFP4 weights, for cuBLAS past 8 rows.
 *
 * Why: from 9 rows an NVFP4 linear runs cuBLAS on a bf16 expansion of its weight
 * (cublas_dequant_bf16). Made per call, that expansion writes 2 bytes a weight and the GEMM reads
 * them back: at GLM-5's batch 64 the copies took ~200 us of a 3.94 ms MoE layer on an H100 even
 * at the copy rate. Made once at load, a dense weight (attention, a dense MLP, a shared expert:
 * read in full every step) costs 2 bytes a weight of device memory beside its NVFP4 image, which
 * the 1-8-row GEMVs keep reading. The backend makes them while their total stays within
 * dense_copy_budget (set from the device's memory, 0: none); the rest stay per call.
 *
 * The table maps a weight's data pointer to its copy: open addressing, a power-of-two capacity at
 * most half full, so a lookup on every linear costs a probe or two.
 */
#include "backend/cuda/cuda_backend_internal.h"

#include <stdlib.h>

#include "backend/cuda/common/common.h"
#include "base/log.h"

static size_t slot_of(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h & (cap - 1);
}

static bool table_insert(struct cuda_backend *c, const void *data, const uint16_t *copy)
{
    if (2 * (c->n_dense_copies + 1) > c->cap_dense_copies) {
        size_t cap = c->cap_dense_copies ? 2 * c->cap_dense_copies : 64;
        struct cuda_dense_copy *t = calloc(cap, sizeof *t);
        if (!t)
            return false;
        for (size_t i = 0; i < c->cap_dense_copies; i++)
            if (c->dense_copies[i].data) {
                size_t s = slot_of(c->dense_copies[i].data, cap);
                while (t[s].data)
                    s = (s + 1) & (cap - 1);
                t[s] = c->dense_copies[i];
            }
        free(c->dense_copies);
        c->dense_copies = t;
        c->cap_dense_copies = cap;
    }
    size_t s = slot_of(data, c->cap_dense_copies);
    while (c->dense_copies[s].data)
        s = (s + 1) & (c->cap_dense_copies - 1);
    c->dense_copies[s] = (struct cuda_dense_copy){.data = data, .bf16 = copy};
    c->n_dense_copies++;
    return true;
}

const uint16_t *cuda_dense_copy_find(const struct cuda_backend *c, const void *data)
{
    if (!c->n_dense_copies || !data)
        return NULL;
    for (size_t s = slot_of(data, c->cap_dense_copies);; s = (s + 1) & (c->cap_dense_copies - 1)) {
        if (c->dense_copies[s].data == data)
            return c->dense_copies[s].bf16;
        if (!c->dense_copies[s].data)
            return NULL;
    }
}

void cuda_dense_copy_make(struct cuda_backend *c, const struct weight *w, unsigned flags)
{
    if (w->format != WEIGHT_NVFP4 || flags != WEIGHT_LOAD_DENSE || !w->data || !w->scale)
        return;
    const size_t bytes = (size_t)w->rows * (size_t)w->cols * sizeof(uint16_t);
    if (cuda_dense_copy_find(c, w->data))
        return;
    if (c->dense_copy_bytes + bytes > c->dense_copy_budget) {
        if (c->dense_copy_budget && !c->dense_copy_full)
            LOG_INFO("cuda: resident bf16 copies of dense NVFP4 weights stop at %.2f GB (budget %.2f GB); the "
                     "rest expand per call at 9+ rows",
                     (double)c->dense_copy_bytes / 1e9, (double)c->dense_copy_budget / 1e9);
        c->dense_copy_full = true;
        return;
    }
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) { /* no room: this weight stays per call */
        (void)cudaGetLastError();
        return;
    }
    const struct cuda_wdev wd = {.data = w->data, .scale = w->scale, .bias = w->bias, .scale2 = w->scale2};
    if (!CHECK(c, cuda_nvfp4_to_bf16(c->stream, &wd, w->rows, w->cols, p)) ||
        !CHECK(c, cudaStreamSynchronize(c->stream)) || !cuda_own(c, p)) {
        CHECK(c, cudaFree(p));
        return;
    }
    if (table_insert(c, w->data, p)) /* else p stays owned (freed with the backend), unused */
        c->dense_copy_bytes += bytes;
}
