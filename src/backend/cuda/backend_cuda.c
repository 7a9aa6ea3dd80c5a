/* backend_cuda.c — the CUDA backend's host side: the ops table, device memory,
 * the stream, the cuBLAS handle, weight upload, CUDA graphs, and the plan -> kernel
 * configuration (see backend_cuda.h).
 *
 * Everything runs on one non-blocking stream of the device chosen at creation;
 * upload/download/synchronize order against it. Weights are copied once, in their
 * file format, into allocations this backend owns (the model's struct weight only
 * borrows them) and freed at destroy.
 *
 * Linear layers: F32 weights through cuBLAS SGEMM (no TF32); BF16 through cuBLAS on
 * activations split into bf16 hi + lo (rounded once to bf16 they put a golden fixture
 * 7.5e-2 away from transformers, the split stays near 1e-5); NVFP4 at up to 8 rows
 * through the tensor-core GEMV, above that as a bf16 copy made per call and cuBLAS
 * where the plan says so; other formats through our GEMMs, which read the stored
 * format and accumulate in fp32. MoE experts: the pair-by-pair decode kernels at few
 * tokens, the sorted grouped GEMMs above (cuda_moe.cu sorts and combines), with no
 * host synchronisation.
 *
 * Tiles come from the plan built at creation; nothing here compares compute
 * capabilities. A plan entry that does not fit a kernel's own shared-memory layout
 * is shrunk to fit the budget, never grown.
 *
 * Not here: multiple devices per backend, a quantized KV cache.
 */
#include "backend/cuda/backend_cuda.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend_internal.h"
#include "backend/cuda/cuda_registry.h"
#include "base/log.h"
#include "base/options.h"

/* ---------------------------------------------------------------- lifetime */

static void cuda_backend_free(struct cuda_backend *c)
{
    if (c->stream)
        CHECK(c, cudaStreamSynchronize(c->stream));
    for (size_t i = 0; i < c->n_owned; i++)
        CHECK(c, cudaFree(c->owned[i]));
    cuda_graphs_drop(c);
    free(c->graphs);
    for (int i = 0; i < c->n_tables; i++) {
        CHECK(c, cudaFree(c->tables[i].dev));
        free(c->tables[i].host);
    }
    if (c->scratch)
        CHECK(c, cudaFree(c->scratch));
    if (c->expand_buf)
        CHECK(c, cudaFree(c->expand_buf));
    if (c->sem)
        CHECK(c, cudaFree(c->sem));
    if (c->blas)
        CHECK(c, cublasDestroy(c->blas));
    if (c->stream)
        CHECK(c, cudaStreamDestroy(c->stream));
    free(c->owned);
    free(c->dense_copies);
    free(c->tables);
    free(c->tmp);
    free(c);
}

static void cu_destroy(struct backend *be)
{
    /* the kernels' phase records (a -DMOESERVE_KERNEL_TRACE=ON build), where asked for */
    struct options o;
    struct err e;
    if (be->impl && options_read(&o, &e) == STATUS_OK && o.trace_out[0])
        cuda_ktrace_dump(o.trace_out);
    if (be->impl)
        cuda_backend_free(cuda_ctx(be));
    be->impl = NULL;
}

static const struct backend_ops CUDA_OPS = {
    .name = "cuda",
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .synchronize = cu_synchronize,
    .weight_load = cu_weight_load,
    .weight_make = cu_weight_make,
    .embed = cu_embed,
    .linear = cu_linear,
    .rmsnorm = cu_rmsnorm,
    .add_rmsnorm = cu_add_rmsnorm,
    .rope = cu_rope,
    .kv_store = cu_kv_store,
    .attention = cu_attention,
    .silu_mul = cu_silu_mul,
    .moe_route = cu_moe_route,
    .router_route = cu_router_route,
    .norm_router_route = cu_norm_router_route,
    .moe_experts = cu_moe_experts,
    .moe_experts_shared = cu_moe_experts_shared,
    .moe_mask_ids = cu_moe_mask_ids,
    .add = cu_add,
    .linear_multi = cu_linear_multi,
    .rope_multi = cu_rope_multi,
    .attn_prep = cu_attn_prep,
    .argmax = cu_argmax,
    .sample = cu_sample,
    .logits_edit = cu_logits_edit,
    .logprobs = cu_logprobs,
    .graph_replay = cu_graph_replay,
    .graph_capture_begin = cu_graph_capture_begin,
    .graph_capture_end = cu_graph_capture_end,
    .layernorm = cu_layernorm,
    .mla_store = cu_mla_store,
    .mla_absorb_q = cu_mla_absorb_q,
    .mla_attention = cu_mla_attention,
    .mla_expand_o = cu_mla_expand_o,
    .mla_attention_expanded = cu_mla_attention_expanded,
    .mla_prefers_expanded = cu_mla_prefers_expanded,
    .dsa_select = cu_dsa_select,
};

/* The compiled tile with the largest tile_m not above the plan's. */
static enum cuda_gemm_tile gemm_tile_from(const struct op_plan *op)
{
    if (op->tile_m >= 64)
        return CUDA_GEMM_64x64;
    if (op->tile_m >= 32)
        return CUDA_GEMM_32x64;
    return CUDA_GEMM_16x64;
}

/* The MLA attention kernel and its tile from the plan's "mla_attention" entry (again after
 * backend_cuda_force()). */
static void configure_mla(struct cuda_backend *c)
{
    const struct op_plan *op;
    c->mla_attn = (struct cuda_mla_cfg){.rows = 16, .keys = 16, .threads = 128, .stages = 1};
    c->mla_mma = (struct cuda_mla_cfg){0};
    c->mla_wgmma = false;
    if ((op = plan_find(&c->plan, "mla_attention")) && !strcmp(op->kernel, "mla_latent_attn_wgmma_bf16")) {
        /* over a bf16 or fp8 cache of its one latent shape; other shapes (a plan made for GLM-5's,
         * run on others: the op tests) take the mma form's tile below, as they did before it */
        c->mla_wgmma = true;
        c->mla_mma = plan_mla_mma_smem(32, 32, PLAN_MLA_WGMMA_DK, 2) + 256 <= c->smem_budget
                         ? (struct cuda_mla_cfg){.rows = 32, .keys = 32, .stages = 2}
                         : (struct cuda_mla_cfg){.rows = 16, .keys = 32, .stages = 1};
    } else if (op && !strcmp(op->kernel, "mla_latent_attn_mma_bf16")) {
        /* over a bf16 cache; an f32 cache (reference runs) takes the fp32 kernel's default tile. A
         * forced entry keeps the tile of the kernel the plan had chosen: where that is not one of
         * the mma form's, its H100 tile (32 x 32, 2 stages) where that fits GLM-5's rows, else
         * 16 x 32, one stage */
        c->mla_mma = (struct cuda_mla_cfg){.rows = op->tile_m, .keys = op->tile_n, .stages = op->stages};
        if (op->tile_m != 16 && op->tile_m != 32)
            c->mla_mma = plan_mla_mma_smem(32, 32, PLAN_MLA_WGMMA_DK, 2) + 256 <= c->smem_budget
                             ? (struct cuda_mla_cfg){.rows = 32, .keys = 32, .stages = 2}
                             : (struct cuda_mla_cfg){.rows = 16, .keys = 32, .stages = 1};
    } else if (op) {
        if (op->tile_m > 0)
            c->mla_attn.rows = op->tile_m; /* heads of one token per block */
        if (op->tile_n > 0)
            c->mla_attn.keys = op->tile_n;
        if (op->threads >= 32)
            c->mla_attn.threads = op->threads;
        c->mla_attn.stages = op->stages;
    } else {
        /* a plan for a model without MLA layers has none */
        LOG_DEBUG("cuda: the plan has no mla_attention entry; using 16 heads x 16 keys");
    }
}

/* Reads the kernel configuration out of the plan. A missing entry means the
 * portable default, said loudly (devices.md, planner rule 4). */
static void configure_from_plan(struct cuda_backend *c)
{
    const struct op_plan *op;
    c->attn_prefill = (struct cuda_attn_cfg){.rows = 64, .keys = 64, .threads = 128};
    if ((op = plan_find(&c->plan, "attention_prefill"))) {
        if (op->tile_m > 0)
            c->attn_prefill.rows = op->tile_m;
        if (op->tile_n > 0)
            c->attn_prefill.keys = op->tile_n;
        if (op->threads >= 32)
            c->attn_prefill.threads = op->threads;
        if (!strcmp(op->kernel, "attn_prefill_mma_bf16")) /* fitted per head_dim; fp32 for other dims */
            c->attn_mma =
                (struct cuda_attn_mma_cfg){.rows = op->tile_m, .keys = op->tile_n, .stages = op->stages};
    } else {
        LOG_WARN("cuda: the plan has no attention_prefill entry; using the portable 64x64 tile");
    }
    c->attn_mma.prec = c->attn_prec;
    c->attn_decode = (struct cuda_attn_cfg){.rows = 0, .keys = 64, .threads = 128};
    if ((op = plan_find(&c->plan, "attention_decode"))) {
        if (op->tile_m > 0)
            c->attn_decode.rows = op->tile_m; /* query heads of one KV head per block */
        if (op->tile_n > 0)
            c->attn_decode.keys = op->tile_n;
        if (op->threads >= 32)
            c->attn_decode.threads = op->threads;
    } else {
        LOG_WARN("cuda: the plan has no attention_decode entry; using 64 keys per step");
    }
    /* Decode kernels overlap their start with the previous kernel's end where the device has
     * programmatic dependent launch; cluster merges where the device has clusters. Which linear,
     * expert and routing kernels run: the plan's dispatch table. */
    const struct device_caps *caps = &c->plan.caps;
    c->pdl = caps->pdl;
    c->moe_smem_min = 2;
    c->attn_cluster = caps->clusters;
    c->attn_push = true;
    configure_mla(c);
    c->dsa = (struct cuda_dsa_cfg){.keys = 128, .stages = 1};
    if ((op = plan_find(&c->plan, "dsa_index")) && !strcmp(op->kernel, "dsa_index_score_mma_bf16")) {
        c->dsa.mma = c->dsa.per_warp = 1; /* the warp kernel for shapes the mma one does not take */
    } else if (op && !strcmp(op->kernel, "dsa_index_score_warp_fp32")) {
        c->dsa.per_warp = 1;
    } else if (op) {
        if (op->tile_n > 0)
            c->dsa.keys = op->tile_n;
        c->dsa.stages = op->stages;
    } else {
        LOG_DEBUG("cuda: the plan has no dsa_index entry (no DSA layers); using 128 keys per block");
    }
    c->tile_moe = CUDA_GEMM_64x64;
    if ((op = plan_find(&c->plan, "moe_experts_gemm"))) {
        c->tile_moe = gemm_tile_from(op);
        c->wg_moe = (struct cuda_wgmma_tile){
            .tokens = op->tile_m, .rows = op->tile_n, .k = op->tile_k, .stages = 4};
    } else {
        LOG_WARN("cuda: the plan has no moe_experts_gemm entry; using the 64x64 fp32 tile");
    }
    /* "linear" is cuBLAS (no tile) for 16-bit weights; the quantised ones then use the expert tile */
    c->tile_linear = c->tile_moe;
    c->wg_linear = c->wg_moe;
    if ((op = plan_find(&c->plan, "linear")) && op->tile_m > 0) {
        c->tile_linear = gemm_tile_from(op);
        c->wg_linear = (struct cuda_wgmma_tile){
            .tokens = op->tile_m, .rows = op->tile_n, .k = op->tile_k, .stages = 4};
    }
}

/* The plan's variant filter: the kernels of this backend's table (cuda_registry.c), the wgmma
 * GEMMs only where their sm_90a image loaded on this device (*ctx: cuda_gemm_wgmma_loadable()). */
static bool variant_loads(void *ctx, const char *kernel)
{
    if (!cuda_kernel_registered(NULL, kernel))
        return false;
    return !strstr(kernel, "wgmma") || *(const bool *)ctx;
}

int backend_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

enum status backend_cuda_create(struct backend *be, int device, size_t smem_budget, struct err *err)
{
    return backend_cuda_create_for(be, device, smem_budget, NULL, NULL, err);
}

enum status backend_cuda_create_for(struct backend *be, int device, size_t smem_budget,
                                    const struct plan_shapes *shapes, const struct plan_weights *weights,
                                    struct err *err)
{
    memset(be, 0, sizeof *be);
    int n = backend_cuda_device_count();
    if (device < 0 || device >= n)
        return err_set(err, STATUS_UNSUPPORTED, "cuda: device %d requested, %d CUDA device%s usable", device,
                       n, n == 1 ? "" : "s");
    struct options opt;
    enum status st = options_read(&opt, err);
    if (st)
        return st;
    if (!smem_budget)
        smem_budget = opt.smem_budget;
    struct cuda_backend *c = calloc(1, sizeof *c);
    if (!c)
        return err_set(err, STATUS_NOMEM, "cuda: out of host memory");
    c->device = device;
    struct device_caps caps;
    c->wgmma_loads = cuda_gemm_wgmma_loadable(device);
    struct plan_request req = {.shapes = shapes,
                               .weights = weights,
                               .smem_budget = smem_budget,
                               .variant_loads = variant_loads,
                               .variant_ctx = &c->wgmma_loads,
                               .kernels = &CUDA_KERNELS,
                               .force = opt.cuda_force[0] ? opt.cuda_force : NULL};
    if ((st = plan_caps_probe(&caps, device, err)) || (st = plan_build_request(&c->plan, &caps, &req, err))) {
        err_prefix(err, "cuda: planning for device %d", device);
        free(c);
        return st;
    }
    if (!CHECK(c, cudaSetDevice(device)) ||
        !CHECK(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking))) {
        st = cuda_sink_status(&c->sink, err);
        cuda_backend_free(c);
        return st;
    }
    if (!CHECK(c, cublasCreate(&c->blas)) || !CHECK(c, cublasSetStream(c->blas, c->stream)) ||
        !CHECK(c, cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH))) {
        st = cuda_sink_status(&c->sink, err);
        cuda_backend_free(c);
        return st;
    }
    c->smem_budget = c->plan.smem_budget ? c->plan.smem_budget : c->plan.caps.smem_per_block_optin;
    if (!c->smem_budget)
        c->smem_budget = 48 * 1024;
    c->sm_count = c->plan.caps.sm_count;
    if (c->sm_count <= 0 &&
        !CHECK(c, cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device)))
        c->sm_count = 1;
    if (opt.attn_splits_none)
        c->force_splits = -1;
    else if (opt.attn_splits > 0)
        c->force_splits = opt.attn_splits;
    configure_from_plan(c);
    /* where the plan runs 9+-row NVFP4 linears through cuBLAS on a bf16 copy, dense weights keep
     * theirs resident, up to an eighth of the device's memory (cuda_dense_copy.c) */
    const struct plan_dispatch *dl = plan_dispatch_for(&c->plan, PLAN_OP_LINEAR, 64, WEIGHT_NVFP4);
    if (dl->n && dl->kernels[0]->id == CK_CUBLAS_DEQUANT)
        c->dense_copy_budget = c->plan.caps.total_mem / 8;
    LOG_DEBUG("cuda: %s", cuda_build_arch_list());
    const struct plan_dispatch *d1 = plan_dispatch_for(&c->plan, PLAN_OP_MOE_EXPERTS, 1, c->plan.weights.experts),
                               *dn = plan_dispatch_for(&c->plan, PLAN_OP_MOE_EXPERTS, 1 << 20, c->plan.weights.experts);
    LOG_INFO("cuda: device %d (%s), %d SMs, shared-memory budget %zu bytes/block; attention prefill %dx%d "
             "(%d threads), decode %d keys; experts %s at 1 token, %s in prefill (moeserve plan: the whole table)",
             device, c->plan.caps.name, c->sm_count, c->smem_budget, c->attn_prefill.rows, c->attn_prefill.keys,
             c->attn_prefill.threads, c->attn_decode.keys, d1->n ? d1->kernels[0]->name : "-",
             dn->n ? dn->kernels[0]->name : "-");
    be->ops = &CUDA_OPS;
    be->impl = c;
    return STATUS_OK;
}

enum status backend_cuda_status(const struct backend *be, struct err *err)
{
    return cuda_sink_status(&((const struct cuda_backend *)be->impl)->sink, err);
}

void *backend_cuda_stream(struct backend *be)
{
    return cuda_ctx(be)->stream;
}

const struct plan *backend_cuda_plan(const struct backend *be)
{
    return &((const struct cuda_backend *)be->impl)->plan;
}

void backend_cuda_set_attention_precision(struct backend *be, int prec)
{
    struct cuda_backend *c = cuda_ctx(be);
    c->attn_prec = prec >= 0 && prec <= 2 ? prec : 0;
    c->attn_mma.prec = c->attn_prec;
    cuda_graphs_drop(c); /* captured steps ran the old operands */
}

void backend_cuda_set_attention_splits(struct backend *be, int n)
{
    cuda_ctx(be)->force_splits = n;
}

void backend_cuda_set_legacy_decode(struct backend *be, bool on)
{
    cuda_ctx(be)->legacy_decode = on;
}

void backend_cuda_set_attn_cluster(struct backend *be, bool on)
{
    struct cuda_backend *c = cuda_ctx(be);
    c->attn_cluster = on && c->plan.caps.clusters;
}

void backend_cuda_set_attn_push(struct backend *be, bool on)
{
    cuda_ctx(be)->attn_push = on;
}

void backend_cuda_set_dense_copy_budget(struct backend *be, size_t bytes)
{
    cuda_ctx(be)->dense_copy_budget = bytes;
}

size_t backend_cuda_dense_copy_bytes(const struct backend *be)
{
    return ((const struct cuda_backend *)be->impl)->dense_copy_bytes;
}

void backend_cuda_set_moe_smem(struct backend *be, int min_tokens)
{
    cuda_ctx(be)->moe_smem_min = min_tokens < 0 ? 0 : min_tokens;
}

enum status backend_cuda_force(struct backend *be, const char *force, struct err *err)
{
    struct cuda_backend *c = cuda_ctx(be);
    struct plan_request req = {.variant_loads = variant_loads,
                               .variant_ctx = &c->wgmma_loads,
                               .kernels = &CUDA_KERNELS,
                               .force = force && *force ? force : NULL};
    cuda_graphs_drop(c); /* captured steps ran the old choices */
    enum status st = plan_dispatch_fill(&c->plan, &req, err);
    configure_mla(c); /* a forced mla_attention entry */
    return st;
}
