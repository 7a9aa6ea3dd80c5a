/* cuda_registry.c — see cuda_registry.h. One line per kernel the backend has; the order is not a
 * preference (the planner ranks them). The fits functions are the kernels' own limits
 * (cuda_decode_limits.h, cuda_gemm_limits.h), which their launchers check too. */
#include "backend/cuda/cuda_registry.h"

#include <stddef.h>

#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/decode/cuda_decode_limits.h"
#include "backend/cuda/gemm/cuda_gemm_limits.h"
#include "backend/cuda/moe/cuda_route_limits.h"

/* Each dispatched kernel's launcher (cuda_launch.h), by its id; only a CUDA build has them. */
#if MOESERVE_HAVE_CUDA
#define LAUNCH_CK_GEMV_MMA cuda_launch_gemv_mma
#define LAUNCH_CK_GEMV1 cuda_launch_gemv1
#define LAUNCH_CK_CUBLAS_BF16 cuda_launch_cublas_bf16
#define LAUNCH_CK_CUBLAS_DEQUANT cuda_launch_cublas_dequant
#define LAUNCH_CK_CUBLAS_SGEMM cuda_launch_cublas_sgemm
#define LAUNCH_CK_GEMM_WGMMA cuda_launch_gemm_wgmma
#define LAUNCH_CK_GEMM_MMA cuda_launch_gemm_mma
#define LAUNCH_CK_GEMM_FP32 cuda_launch_gemm_fp32
#define LAUNCH_CK_MOE_PAIR_MMA cuda_launch_moe_pair_mma
#define LAUNCH_CK_MOE_PAIR cuda_launch_moe_pair
#define LAUNCH_CK_MOE_WGMMA cuda_launch_moe_wgmma
#define LAUNCH_CK_MOE_MMA cuda_launch_moe_mma
#define LAUNCH_CK_MOE_FP32 cuda_launch_moe_fp32
#define LAUNCH_CK_MOE_GROUPED_MMA cuda_launch_moe_grouped_mma
#define LAUNCH_CK_NORM_ROUTER_ROUTE cuda_launch_norm_router_route
#define LAUNCH_CK_ROUTER_ROUTE_CLUSTER cuda_launch_router_route_cluster
#define LAUNCH_CK_ROUTER_ROUTE_COUNT cuda_launch_router_route_count
#else
#define LAUNCH_CK_GEMV_MMA NULL
#define LAUNCH_CK_GEMV1 NULL
#define LAUNCH_CK_CUBLAS_BF16 NULL
#define LAUNCH_CK_CUBLAS_DEQUANT NULL
#define LAUNCH_CK_CUBLAS_SGEMM NULL
#define LAUNCH_CK_GEMM_WGMMA NULL
#define LAUNCH_CK_GEMM_MMA NULL
#define LAUNCH_CK_GEMM_FP32 NULL
#define LAUNCH_CK_MOE_PAIR_MMA NULL
#define LAUNCH_CK_MOE_PAIR NULL
#define LAUNCH_CK_MOE_WGMMA NULL
#define LAUNCH_CK_MOE_MMA NULL
#define LAUNCH_CK_MOE_FP32 NULL
#define LAUNCH_CK_MOE_GROUPED_MMA NULL
#define LAUNCH_CK_NORM_ROUTER_ROUTE NULL
#define LAUNCH_CK_ROUTER_ROUTE_CLUSTER NULL
#define LAUNCH_CK_ROUTER_ROUTE_COUNT NULL
#endif
#define LAUNCH_CK_FIXED NULL /* an op with one kernel, launched by the op itself */
#define LAUNCH_OF(id) LAUNCH_##id

#define F(fmt) (1u << (fmt))
#define ANY_WEIGHT (F(WEIGHT_F32) | F(WEIGHT_BF16) | F(WEIGHT_F16) | F(WEIGHT_FP8_BLOCK) | F(WEIGHT_NVFP4))
#define FP32 "fp32_fma"
#define MMA "bf16_mma"
#define WGMMA "bf16_wgmma"
#define BMMA KERNEL_NEEDS_BF16_MMA
#define WG KERNEL_NEEDS_WGMMA
#define CL KERNEL_NEEDS_CLUSTERS

static bool fits_gemv_mma(const struct kernel_shape *s, size_t budget)
{
    return cuda_gemv_mma_fits(s->n_weights, s->k, s->tokens, budget);
}

static bool fits_gemv1(const struct kernel_shape *s, size_t budget)
{
    return s->tokens == 1 && s->n_weights <= MAX_JOBS && cuda_gemv1_fits(s->format, s->k, budget);
}

/* the tensor-core GEMMs: past the GEMVs' 8 rows (fewer rows waste most of a tile) */
static bool fits_gemm_wgmma(const struct kernel_shape *s, size_t budget)
{
    return s->tokens > 8 && cuda_gemm_wgmma_fits(s->format, s->k) &&
           cuda_wgmma_tile_smem(&CUDA_WGMMA_TILES[0]) <= budget;
}

static bool fits_gemm_mma(const struct kernel_shape *s, size_t budget)
{
    (void)budget;
    return s->tokens > 8 && cuda_gemm_mma_fits(s->format, s->k);
}

static bool fits_moe_pair_mma(const struct kernel_shape *s, size_t budget)
{
    return (int64_t)s->tokens * s->n_used <= 65535 &&
           cuda_moe_decode_mma_fits(s->format, s->d_model, s->d_expert, s->n_used, budget);
}

static bool fits_moe_pair(const struct kernel_shape *s, size_t budget)
{
    return (int64_t)s->tokens * s->n_used <= 65535 &&
           cuda_moe_decode_fits(s->format, s->d_model, s->d_expert, s->n_used, budget);
}

static bool fits_moe_wgmma(const struct kernel_shape *s, size_t budget)
{
    return cuda_gemm_wgmma_fits(s->format, s->d_model) && cuda_gemm_wgmma_fits(s->format, s->d_expert) &&
           cuda_wgmma_tile_smem(&CUDA_WGMMA_TILES[0]) <= budget;
}

static bool fits_moe_mma(const struct kernel_shape *s, size_t budget)
{
    (void)budget;
    return cuda_gemm_mma_fits(s->format, s->d_model) && cuda_gemm_mma_fits(s->format, s->d_expert);
}

static bool fits_moe_grouped_mma(const struct kernel_shape *s, size_t budget)
{
    return cuda_moe_grouped_mma_fits(s->format, s->d_model, s->d_expert, budget);
}

/* The pair kernels' shared-memory form (from 2 tokens, where it fits): its larger kernel's bytes,
 * with the down kernel's tiles a warp as the launch chooses them. */
static size_t smem_moe_pair_mma(const struct kernel_shape *s, size_t budget, int sm_count)
{
    const int tpw = cuda_moe_decode_mma_smem_tpw(s->d_model, s->d_expert, s->n_used, sm_count, budget);
    if (!tpw)
        return 0;
    size_t gu = cuda_moe_decode_mma_smem_bytes(s->d_model, s->d_expert, tpw, 0),
           dn = cuda_moe_decode_mma_smem_bytes(s->d_model, s->d_expert, tpw, 1) + cuda_moe_decode_mma_down_static_smem();
    return gu > dn ? gu : dn;
}

/* the router + routing kernels (the router's format, its width k, the routing's experts); the
 * norm form only where the call offers the norm */
static bool fits_norm_router_route(const struct kernel_shape *s, size_t budget)
{
    return s->norm_first && cuda_norm_router_route_fits(s->format, s->k, s->tokens, s->n_experts, s->n_used,
                                                        s->n_group, budget);
}

static bool fits_router_route_cluster(const struct kernel_shape *s, size_t budget)
{
    return cuda_router_route_cluster_fits(s->format, s->k, s->tokens, s->n_experts, s->n_used, s->n_group, budget);
}

static bool fits_router_route_count(const struct kernel_shape *s, size_t budget)
{
    return cuda_router_route_fits(s->format, s->k, s->tokens, s->n_experts, s->n_used, s->n_group, budget);
}

#define LIN "linear,linear_decode"
#define MOE "moe_experts_gemm,moe_experts_decode"
/* one kernel: name, ops, math, needed features, weight formats, file, dispatch id, limits, and
 * the names (a regex) its launches have in a profiler (tools/trace_check.sh) */
#define K(nm, op_, math_, needs_, fmts, file, id_, fits_, sym)                                                \
    {.name = nm, .op = op_, .math = math_, .needs = needs_, .formats = fmts, .where = file, .id = id_,          \
     .fits = fits_, .tiles = NULL, .n_tiles = 0, .tile_smem = NULL, .shape_smem = NULL, .symbols = sym,             \
     .launch = LAUNCH_OF(id_)}
/* ... a tiled one: its compiled tiles and their shared memory */
#define KT(...) KT_(__VA_ARGS__) /* WG_TILES expands to three arguments first */
#define KT_(nm, op_, math_, needs_, fmts, file, id_, fits_, tiles_, n_, smem_, sym)                           \
    {.name = nm, .op = op_, .math = math_, .needs = needs_, .formats = fmts, .where = file, .id = id_,          \
     .fits = fits_, .tiles = tiles_, .n_tiles = n_, .tile_smem = smem_, .shape_smem = NULL, .symbols = sym,           \
     .launch = LAUNCH_OF(id_)}
#define WG_TILES CUDA_WGMMA_TILES, CUDA_WGMMA_N_TILES, cuda_wgmma_tile_smem

static const struct kernel_desc KERNELS[] = {
    /* small ops: one kernel each */
    K("embedding_gather_bf16", "embedding", FP32, 0, 0, "common/cuda_elementwise.cu", CK_FIXED, NULL, NULL),
    K("rmsnorm_residual_warp", "rmsnorm", FP32, 0, 0, "common/cuda_norm.cu", CK_FIXED, NULL, NULL),
    K("rmsnorm_residual_block", "rmsnorm", FP32, 0, 0, "common/cuda_norm.cu", CK_FIXED, NULL, NULL),
    K("rope_bf16", "rope_qk_norm", FP32, 0, 0, "common/cuda_fused.cu", CK_FIXED, NULL, NULL),
    K("rope_qk_norm_bf16", "rope_qk_norm", FP32, 0, 0, "common/cuda_fused.cu", CK_FIXED, NULL, NULL),
    K("rope_mla_bf16", "rope_qk_norm", FP32, 0, 0, "common/cuda_rope.cu", CK_FIXED, NULL, NULL),
    K("kv_cache_write_bf16", "kv_cache_write", FP32, 0, 0, "common/cuda_elementwise.cu", CK_FIXED, NULL, NULL),
    K("sample_topk_topp", "sample", FP32, 0, 0, "common/cuda_fused.cu", CK_FIXED, NULL, NULL),
    K("logits_edit", "logits_edit", FP32, 0, 0, "common/cuda_fused.cu", CK_FIXED, NULL, NULL),
    K("logprobs_topk", "logprobs", FP32, 0, 0, "common/cuda_fused.cu", CK_FIXED, NULL, NULL),
    K("argmax_split", "argmax", FP32, 0, 0, "common/cuda_fused.cu", CK_FIXED, NULL, NULL),
    /* attention */
    K("attn_prefill_fp32", "attention_prefill", FP32, 0, 0, "attention/cuda_attention.cu", CK_FIXED, NULL, NULL),
    K("attn_prefill_mma_bf16", "attention_prefill", MMA, BMMA, 0, "attention/cuda_attention_mma.cu", CK_FIXED, NULL, NULL),
    K("attn_decode_split_fp32", "attention_decode", FP32, 0, 0, "attention/cuda_attn_decode.cu", CK_FIXED, NULL, NULL),
    K("mla_latent_attn_fp32", "mla_attention", FP32, 0, 0, "mla/cuda_mla.cu", CK_FIXED, NULL, "mla_attn_kernel|mla_merge_kernel"),
    K("mla_latent_attn_mma_bf16", "mla_attention", MMA, BMMA, 0, "mla/cuda_mla_mma.cu", CK_FIXED, NULL, "mla_mma_kernel|mla_merge_kernel"),
    K("mla_latent_attn_wgmma_bf16", "mla_attention", WGMMA, WG, 0, "mla/cuda_mla_wgmma.cu", CK_FIXED, NULL, "mla_wgmma_kernel|mla_merge_kernel"),
    K("mla_prefill_absorbed", "mla_prefill", NULL, 0, 0, "mla/cuda_mla_mma.cu", CK_FIXED, NULL, "mla_mma_kernel|mla_attn_kernel"),
    K("mla_prefill_expanded", "mla_prefill", MMA, BMMA, 0, "cuda_mla_expand.c", CK_FIXED, NULL, "mla_expand_gather_kernel|mla_expand_assemble_kernel|attn_mma_kernel"),
    K("mla_proj_fp32", "mla_proj", FP32, 0, ANY_WEIGHT, "mla/cuda_mla.cu", CK_FIXED, NULL, "mla_absorb_kernel|mla_expand_kernel"),
    K("mla_proj_mma_bf16", "mla_proj", MMA, BMMA, F(WEIGHT_NVFP4), "mla/cuda_mla_absorb_mma.cu", CK_FIXED, NULL, "mla_absorb_mma_kernel|mla_expand_mma_kernel"),
    K("dsa_index_score_fp32", "dsa_index", FP32, 0, 0, "mla/cuda_dsa.cu", CK_FIXED, NULL, "dsa_score_kernel|dsa_topk(_hist)?_kernel|dsa_hist_kernel"),
    K("dsa_index_score_warp_fp32", "dsa_index", FP32, 0, 0, "mla/cuda_dsa.cu", CK_FIXED, NULL, "dsa_score_warp_kernel|dsa_topk(_hist)?_kernel|dsa_hist_kernel"),
    K("dsa_index_score_mma_bf16", "dsa_index", MMA, BMMA, 0, "mla/cuda_dsa_mma.cu", CK_FIXED, NULL, "dsa_score_mma_kernel|dsa_topk(_hist)?_kernel|dsa_hist_kernel"),
    /* routing */
    K("norm_router_route_cluster", "moe_route", FP32, CL, F(WEIGHT_BF16), "moe/cuda_router_route.cu", CK_NORM_ROUTER_ROUTE, fits_norm_router_route, "router_route_cluster_kernel"),
    K("router_route_cluster", "moe_route", FP32, CL, F(WEIGHT_BF16), "moe/cuda_router_route.cu", CK_ROUTER_ROUTE_CLUSTER, fits_router_route_cluster, "router_route_cluster_kernel"),
    K("router_route_count", "moe_route", FP32, 0, F(WEIGHT_BF16), "moe/cuda_router_route.cu", CK_ROUTER_ROUTE_COUNT, fits_router_route_count, "router_route_kernel"),
    /* ... the routing alone, on the logits of the router linear (whatever the router's format) */
    K("moe_route_softmax_topk", "moe_route", FP32, 0, ANY_WEIGHT, "moe/cuda_moe_route.cu", CK_FIXED, NULL, "moe_route_(rank_|warp_)?kernel"),
    K("moe_route_sigmoid_grouped_topk", "moe_route", FP32, 0, ANY_WEIGHT, "moe/cuda_moe_route.cu", CK_FIXED, NULL, "moe_route_(rank_|warp_)?kernel"),
    K("moe_align_count_sort", "moe_align", FP32, 0, 0, "moe/cuda_moe.cu", CK_FIXED, NULL, NULL),
    K("moe_silu_mul_bf16", "moe_silu_mul", FP32, 0, 0, "common/cuda_elementwise.cu", CK_FIXED, NULL, NULL),
    /* linears (the plan's linear, linear_ffn, lm_head and their few-token form) */
    K("gemv_decode_mma_bf16", LIN, MMA, BMMA, F(WEIGHT_NVFP4), "decode/cuda_decode_mma.cu", CK_GEMV_MMA, fits_gemv_mma, "gemv_mma_kernel"),
    K("gemv_x_smem", LIN, FP32, 0, ANY_WEIGHT, "decode/cuda_decode.cu", CK_GEMV1, fits_gemv1, "gemv1_kernel"),
    K("cublas_bf16", LIN, NULL, 0, F(WEIGHT_BF16), "cuda_dispatch.c", CK_CUBLAS_BF16, NULL, "f32_to_bf16_split_kernel"),
    K("cublaslt_bf16", LIN, NULL, 0, F(WEIGHT_BF16), "cuda_dispatch.c", CK_CUBLAS_BF16, NULL, "f32_to_bf16_split_kernel"),
    K("cublas_sgemm", LIN, NULL, 0, F(WEIGHT_F32), "cuda_dispatch.c", CK_CUBLAS_SGEMM, NULL, "sgemm"),
    K("cublas_dequant_bf16", LIN, NULL, 0, F(WEIGHT_NVFP4), "cuda_dispatch.c", CK_CUBLAS_DEQUANT, NULL, "nvfp4_to_bf16_kernel"),
    KT("gemm_nvfp4_wo_wgmma", LIN, WGMMA, WG, F(WEIGHT_NVFP4), "gemm/cuda_gemm_wgmma.cu", CK_GEMM_WGMMA, fits_gemm_wgmma, WG_TILES, "gemm_wgmma_kernel"),
    K("gemm_nvfp4_wo_mma", LIN, MMA, BMMA, F(WEIGHT_NVFP4), "gemm/cuda_gemm_mma.cu", CK_GEMM_MMA, fits_gemm_mma, "gemm_mma_kernel"),
    K("gemm_nvfp4_wo_fp32", LIN, FP32, 0, F(WEIGHT_NVFP4), "gemm/cuda_gemm.cu", CK_GEMM_FP32, NULL, "gemm_tiled_kernel"),
    K("gemm_fp8_wo_fp32", LIN, FP32, 0, F(WEIGHT_FP8_BLOCK), "gemm/cuda_gemm.cu", CK_GEMM_FP32, NULL, "gemm_tiled_kernel"),
    K("gemm_fp32_tiled", LIN, FP32, 0, ANY_WEIGHT, "gemm/cuda_gemm.cu", CK_GEMM_FP32, NULL, "gemm_tiled_kernel"),
    /* routed experts: pair by pair at few tokens, sorted by expert above */
    {.name = "moe_pair_decode_mma_bf16", .op = MOE, .math = MMA, .needs = BMMA, .formats = F(WEIGHT_NVFP4),
     .where = "decode/cuda_decode_mma.cu", .id = CK_MOE_PAIR_MMA, .fits = fits_moe_pair_mma, .tiles = NULL,
     .n_tiles = 0, .tile_smem = NULL, .shape_smem = smem_moe_pair_mma,
     .symbols = "moe_gate_up_mma_kernel|moe_down_mma_kernel|moe_down_smem_kernel", .launch = LAUNCH_CK_MOE_PAIR_MMA},
    K("moe_pair_decode", MOE, FP32, 0, ANY_WEIGHT, "decode/cuda_decode.cu", CK_MOE_PAIR, fits_moe_pair, "moe_gate_up_kernel|moe_down_kernel"),
    KT("moe_gemm_nvfp4_wo_wgmma", MOE, WGMMA, WG, F(WEIGHT_NVFP4), "gemm/cuda_gemm_wgmma.cu", CK_MOE_WGMMA, fits_moe_wgmma, WG_TILES, "gemm_wgmma_kernel"),
    KT("moe_gemm_bf16_wgmma", MOE, WGMMA, WG, F(WEIGHT_BF16), "gemm/cuda_gemm_wgmma.cu", CK_MOE_WGMMA, fits_moe_wgmma, WG_TILES, "gemm_wgmma_kernel"),
    K("moe_gemm_nvfp4_wo_mma", MOE, MMA, BMMA, F(WEIGHT_NVFP4), "gemm/cuda_gemm_mma.cu", CK_MOE_MMA, fits_moe_mma, "gemm_mma_kernel"),
    K("moe_gemm_bf16_mma", MOE, MMA, BMMA, F(WEIGHT_BF16), "gemm/cuda_gemm_mma.cu", CK_MOE_MMA, fits_moe_mma, "gemm_mma_kernel"),
    K("moe_grouped_mma_bf16", MOE, MMA, BMMA, F(WEIGHT_NVFP4), "decode/cuda_moe_grouped_mma.cu", CK_MOE_GROUPED_MMA, fits_moe_grouped_mma, "moe_grouped_mma_kernel"),
    K("moe_gemm_nvfp4_wo_fp32", MOE, FP32, 0, F(WEIGHT_NVFP4), "gemm/cuda_gemm.cu", CK_MOE_FP32, NULL, "gemm_tiled_kernel"),
    K("moe_gemm_fp8_wo_fp32", MOE, FP32, 0, F(WEIGHT_FP8_BLOCK), "gemm/cuda_gemm.cu", CK_MOE_FP32, NULL, "gemm_tiled_kernel"),
    K("moe_gemm_bf16_fp32", MOE, FP32, 0, F(WEIGHT_BF16) | F(WEIGHT_F16) | F(WEIGHT_F32), "gemm/cuda_gemm.cu", CK_MOE_FP32, NULL, "gemm_tiled_kernel"),
    K("moe_experts_gemm_sorted", MOE, FP32, 0, ANY_WEIGHT, "gemm/cuda_gemm.cu", CK_MOE_FP32, NULL, "gemm_tiled_kernel"),

};

const struct kernel_table CUDA_KERNELS = {
    .backend = "cuda", .kernels = KERNELS, .n = (int)(sizeof KERNELS / sizeof KERNELS[0])};

bool cuda_kernel_registered(void *ctx, const char *kernel)
{
    (void)ctx;
    return kernel_table_find(&CUDA_KERNELS, kernel) != NULL;
}
