/* plan.h — what a GPU has, and which kernel each op runs on it.
 *
 * A struct device_caps is filled from a probe of a real device (CUDA
 * runtime + NVML) or from a named profile (../shared/spec/devices.md); the
 * instruction-set features come from the one capability table
 * (plan/caps_table.c), the only place that maps a compute capability to
 * features. The planner turns caps (+ a model's shapes) into a struct
 * plan: per op, the kernel variant, instruction family, tile, stages, shared
 * memory, expected bound and the reason for the choice. Kernels read their
 * configuration from the plan and never look at the compute capability.
 *
 * Ops of a plan, in forward order (plan_find() by these names; every MoE op
 * has "moe" in its name). tile_m/n/k are what the kernel's block covers:
 *   embedding          token-row gather; tile_m tokens per block
 *   rmsnorm            RMSNorm fused with the residual add; tile_m rows per block
 *   rope_qk_norm       per-head q/k RMSNorm (when the model has it) + RoPE; tile_m tokens
 *   kv_cache_write     k, v (or MLA latent) into the paged bf16 cache; tile_m tokens
 *   attention_prefill  flash-style causal attention: tile_m query rows x tile_n keys x
 *                      tile_k = qk head dim; K/V tiles in smem, `stages` buffers, bf16 operands
 *   attention_decode   split-K (flash-decoding) over the cache: tile_m query heads of one kv
 *                      head (GQA group; all heads for MLA) x tile_n keys x tile_k = head dim;
 *                      split_k chunks for the reference batch (plan_attention_splits() at launch)
 *   mla_attention      MLA (glm_moe_dsa): attention in latent space over the cached [c_kv | k_r]
 *                      rows, one token's tile_m heads per block x tile_n keys per step, split-K
 *                      over the selected keys; planned with GLM-5 dims when there is no model
 *   dsa_index          the DSA indexer's scores: tile_n keys per block (one per thread), then a
 *                      top-k per query
 *   moe_route          router scores (softmax | sigmoid+bias, grouped) + top-k; tile_m tokens
 *   moe_align          token -> expert counting sort, each expert's rows padded to tile_m
 *                      (= moe_experts_gemm's tile_m: the GEMM's row blocks never mix experts)
 *   moe_experts_gemm   grouped expert GEMM (gate_up and down) in the experts' weight format
 *   moe_silu_mul       silu(gate) * up over the gate_up output
 *   linear             attention projections (q/k/v/o; MLA q_a/q_b/kv_a/kv_b/o) in their format
 *   linear_ffn         dense FFN layers and shared experts; present only when the model has them
 *   lm_head            final projection (cuBLAS for bf16)
 *   sample             temperature / top-k / top-p over the logits; tile_m rows per block
 * A kernel launched with smem_bytes > 48 KiB must first raise
 * cudaFuncAttributeMaxDynamicSharedMemorySize to it.
 *
 * Tiles are chosen for a reference workload (struct plan_shapes: a
 * prefill chunk of prefill_tokens tokens, decode of decode_batch sequences
 * at decode_ctx); the kernels accept any size.
 *
 * defines: struct device_caps, enum plan_math, struct op_plan, struct plan_shapes, struct plan,
 *          enum plan_bound, struct plan_weights, struct plan_request,
 *          plan_caps_from_profile(), plan_profile_names(), plan_caps_probe(),
 *          plan_caps_apply_table(), plan_caps_table_warning(), plan_build(),
 *          plan_build_request(), plan_weights_default(),
 *          plan_find(), plan_decode_splits(), plan_math_name(), plan_to_json(),
 *          enum plan_bucket, enum plan_op, struct plan_dispatch, plan_bucket_of(), plan_bucket_name(),
 *          plan_op_name(), plan_op_takes(), plan_dispatch_fill(), plan_dispatch_for(), plan_dispatch_pick(),
 *          plan_mla_attention_smem(), plan_dsa_index_smem(),
 *          plan_caps_to_json(), plan_print(), plan_kernels_to_json(), plan_kernels_print()
 */
#ifndef MOESERVE_PLAN_PLAN_H
#define MOESERVE_PLAN_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/json.h"
#include "base/status.h"
#include "format/weight.h"
#include "plan/kernel_desc.h"

/* Instruction families a kernel's inner loop runs on. */
enum plan_math {
    PLAN_MATH_FP32_FMA,             /* portable: any GPU */
    PLAN_MATH_BF16_MMA,             /* mma.sync m16n8k16 bf16 */
    PLAN_MATH_BF16_WGMMA,           /* wgmma.mma_async, sm_90a */
    PLAN_MATH_BF16_TCGEN05,         /* tcgen05.mma, sm_100a */
    PLAN_MATH_FP8_MMA,              /* mma.sync e4m3 */
    PLAN_MATH_FP8_WGMMA,            /* wgmma e4m3, sm_90a */
    PLAN_MATH_FP4_BLOCK_SCALED_MMA, /* mma.sync kind::mxf4nvf4.block_scale, sm_120a */
    PLAN_MATH_FP4_TCGEN05,          /* tcgen05.mma kind::mxf4nvf4, sm_100a */
    PLAN_MATH_COUNT,
};

struct device_caps {
    char name[128];
    char source[64]; /* "probe:0" or "profile:h200" */
    int cc_major, cc_minor;
    int sm_count;
    size_t smem_per_block_optin; /* the real per-block budget, bytes */
    size_t smem_per_sm;
    size_t total_mem;
    size_t l2_bytes;
    int regs_per_block;
    double mem_bw_gbs; /* measured or datasheet */
    double power_limit_w;
    bool nvlink; /* to at least one peer */
    int n_gpus;
    /* instruction features (from plan/caps_table.c, refined by which variants load) */
    bool bf16_mma;
    bool fp8_mma;
    bool wgmma;                /* sm_90a */
    bool tcgen05;              /* sm_100a */
    bool fp4_mma_block_scaled; /* sm_120a mma.sync kind::mxf4nvf4 */
    bool tma;
    bool pdl;      /* programmatic dependent launch (griddepcontrol): a kernel starts while its
                    * predecessor finishes, sm_90 on */
    bool clusters; /* thread block clusters with distributed shared memory (barrier.cluster,
                    * mapa / ld.shared::cluster), sm_90 on */
    bool known_cc; /* false: newer than the table, portable path + warning */
    /* extensions */
    char arch[16];       /* fatbin target that serves it: "sm_90a"; "" when unknown */
    double sm_clock_ghz; /* boost clock (datasheet for profiles, probed otherwise) */
    int peers;           /* other GPUs this one can access directly (cudaDeviceCanAccessPeer) */
    /* dense FLOP per clock per SM for each family; 0 = not available (caps_table.c) */
    double flops_per_clk_sm[PLAN_MATH_COUNT];
};

enum plan_bound { PLAN_BOUND_MEMORY, PLAN_BOUND_COMPUTE };

#define PLAN_MAX_OPS 32

struct op_plan {
    char op[48];     /* "attention_prefill", "attention_decode", "moe_experts_gemm", "linear", ... */
    char kernel[64]; /* variant name, e.g. "attn_prefill_mma_bf16" */
    char math[32];   /* fp32_fma, bf16_mma, bf16_wgmma, fp4_block_scaled_mma, ... */
    int tile_m, tile_n, tile_k;
    int stages;
    int threads; /* per block */
    size_t smem_bytes;
    enum plan_bound bound;
    char reason[256];
    /* extensions */
    enum plan_math math_id;           /* math as an enum */
    enum weight_format weight_format; /* GEMM ops: the weights' format (WEIGHT_BF16 otherwise) */
    int split_k;                      /* attention_decode: KV chunks for the reference batch; 1 otherwise */
    bool portable_fallback;           /* a tensor-core variant existed but none was eligible */
    bool forced;                      /* MOESERVE_CUDA_FORCE named this entry's kernel */
    double est_us;                    /* cost-model time for the reference workload, microseconds */
};

/* The shapes the plan was sized for. */
struct plan_shapes {
    char source[160]; /* model directory, or "default (Qwen3-30B-A3B-like)" */
    bool mla;
    int d_model, vocab;
    int n_heads, n_kv_heads, head_dim; /* GQA */
    int qk_head_dim, v_head_dim;       /* attention_prefill dims (MLA: nope+rope, v) */
    int decode_k_dim, decode_v_dim;    /* attention_decode dims (MLA: latent+rope, latent) */
    int n_experts, n_experts_used, d_expert;
    int d_ff;                                     /* dense layers / shared experts width; 0 if none */
    int prefill_tokens, decode_batch, decode_ctx; /* the reference workload (the planner sets them) */
    bool qk_norm;        /* per-head q/k RMSNorm before RoPE */
    bool router_sigmoid; /* sigmoid router with grouped top-k (else softmax) */
    /* MLA + DSA (glm_moe_dsa) */
    int q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim;
    int index_n_heads, index_head_dim, index_topk;
    bool latent_mma; /* the latent cache holds bf16 (the default) or fp8 rows, which the tensor-core
                        kernel reads; f32 (reference runs) only the fp32 kernel */
};

/* Weight formats by group, as the checkpoint stores them. */
struct plan_weights {
    enum weight_format experts; /* routed experts' gate/up/down */
    enum weight_format attn;    /* attention projections */
    enum weight_format ffn;     /* dense FFN layers and shared experts */
    enum weight_format lm_head;
    bool fp4_activations; /* W4A4 NVFP4 (calibrated input scales): activations may be FP4 */
};

/* Token-count buckets of a pass: the kernel a dispatched op runs may differ by bucket. */
enum plan_bucket {
    PLAN_BUCKET_1,     /* one token: decode at batch 1 */
    PLAN_BUCKET_2_8,   /* 2-8 */
    PLAN_BUCKET_9_32,  /* 9-32 */
    PLAN_BUCKET_33_64, /* 33-64 */
    PLAN_BUCKET_MORE,  /* 65 and more: prefill chunks, large batches */
    PLAN_BUCKET_COUNT,
};

/* The ops whose kernel the plan chooses per bucket and weight format, and the backend
 * dispatches from that choice alone. */
enum plan_op {
    PLAN_OP_LINEAR,      /* every linear: attention projections, dense MLP, shared experts, router, lm_head */
    PLAN_OP_MOE_EXPERTS, /* the routed experts of a MoE layer */
    /* a MoE layer's routing: the fused router + routing kernels (with the norm before them or
     * not), else the router as a linear and the routing kernel on its logits; the weight format
     * is the router's */
    PLAN_OP_MOE_ROUTE,
    PLAN_OP_COUNT,
};

#define PLAN_DISPATCH_MAX 6

/* What runs for one (op, bucket, weight format): the first of kernels[] whose limits take the
 * call (kernel_desc.fits, checked per call by the backend), in this order. */
struct plan_dispatch {
    const struct kernel_desc *kernels[PLAN_DISPATCH_MAX]; /* borrowed from the backend's table */
    int n;                                                /* 0: not planned (no kernel table) */
    char reason[224];
};

struct plan {
    struct device_caps caps;
    size_t smem_budget; /* min(caps, --smem-budget) */
    struct op_plan ops[PLAN_MAX_OPS];
    int n_ops;
    char warnings[512];
    /* extensions */
    struct plan_shapes shapes;
    struct plan_weights weights;
    /* per op, bucket and weight format; planned only when the request names a kernel table */
    struct plan_dispatch dispatch[PLAN_OP_COUNT][PLAN_BUCKET_COUNT][WEIGHT_FORMAT_COUNT];
};

struct plan_request {
    const struct plan_shapes *shapes;   /* a model's (model/model_plan.h); NULL: Qwen3-30B-A3B-like shapes */
    const struct plan_weights *weights; /* NULL: bf16 everywhere */
    const char *model_name;             /* names the shapes' source (a directory); may be NULL */
    size_t smem_budget;                 /* 0: the device's own */
    /* NULL: every candidate variant is taken to load (profiles). A backend passes
     * its own test (in its fatbin for this device, self-test passed). */
    bool (*variant_loads)(void *ctx, const char *kernel);
    void *variant_ctx;
    /* The backend's kernels (NULL: plan every variant the cost model knows, no dispatch table):
     * only these are planned, and the dispatch table is filled from them. */
    const struct kernel_table *kernels;
    /* "op[@bucket]:kernel,..." (MOESERVE_CUDA_FORCE) or NULL: these kernels first in the dispatch
     * lists they name (every bucket without @), for measuring; refused unless the table has the
     * kernel for that op and the device can run it. */
    const char *force;
};

/* Fills caps for a named profile of spec/devices.md; STATUS_NOT_FOUND lists the names. */
enum status plan_caps_from_profile(struct device_caps *caps, const char *name, struct err *err);
/* "a100, rtx-a6000, ..." */
const char *plan_profile_names(void);
/* Probes CUDA device `index` (STATUS_UNSUPPORTED in a build without CUDA). */
enum status plan_caps_probe(struct device_caps *caps, int index, struct err *err);
/* From caps->cc_major/minor: instruction features, arch, per-SM rates, known_cc; fills
 * smem_per_block_optin / smem_per_sm from the table where they are 0. Returns known_cc. */
bool plan_caps_apply_table(struct device_caps *caps);
/* Why caps is not in the table (empty string when it is). */
void plan_caps_table_warning(const struct device_caps *caps, char *buf, size_t n);

/* smem_budget 0 = the device's own. shapes may be NULL (generic shapes). bf16 weights. */
enum status plan_build(struct plan *p, const struct device_caps *caps, const struct plan_shapes *shapes,
                       size_t smem_budget, struct err *err);
enum status plan_build_request(struct plan *p, const struct device_caps *caps, const struct plan_request *req,
                               struct err *err);
/* bf16 everywhere, or `f` for experts and linears (lm_head stays bf16). */
void plan_weights_default(struct plan_weights *w, enum weight_format f, bool fp4_activations);


const struct op_plan *plan_find(const struct plan *p, const char *op);
/* The bucket of a pass of n_tokens tokens; its name ("1", "2-8", ...); "linear", "moe_experts",
 * "moe_route". */
enum plan_bucket plan_bucket_of(int n_tokens);
const char *plan_bucket_name(enum plan_bucket b);
const char *plan_op_name(enum plan_op op);
/* Whether kernel k serves dispatched op `op` (the kernel_desc.op names each op lists). */
bool plan_op_takes(enum plan_op op, const struct kernel_desc *k);
/* The dispatch list for op at n_tokens and weight format f (n == 0: none planned). */
const struct plan_dispatch *plan_dispatch_for(const struct plan *p, enum plan_op op, int n_tokens,
                                              enum weight_format f);
/* (Re)fills p->dispatch from req->kernels, req->variant_loads and req->force (p's per-op entries
 * and shapes as plan_build_request left them; the other request fields are not read): all empty
 * without a table. STATUS_INVALID names a force item the table or the device refuses. */
enum status plan_dispatch_fill(struct plan *p, const struct plan_request *req, struct err *err);
/* The first kernel of that list whose limits take shape s within the plan's budget, or NULL. */
const struct kernel_desc *plan_dispatch_pick(const struct plan *p, enum plan_op op, const struct kernel_shape *s);
/* Shared memory of the fp32 MLA latent attention tile and the DSA score tile (planner.c's
 * formulas; the CUDA kernels lay their shared memory out exactly so). stages 0: the variant
 * that reads its operands from global memory. */
size_t plan_mla_attention_smem(int rows, int keys, int threads, int k_dim, int v_dim, int stages);
size_t plan_dsa_index_smem(int keys, int idx_heads, int idx_dim, int stages);
/* Whether a dense MLA pass of n_tokens query rows over n_keys keys in all runs in the expanded
 * form (K/V through kv_b, then ordinary attention) rather than the absorbed one: the plan's
 * "mla_prefill" entry chose it and its cost rule favours it at these sizes. */
bool plan_mla_prefill_expanded(const struct plan *p, int n_tokens, int64_t n_keys);
/* dsa_index_score_warp_fp32: a warp per key, `warps` keys in flight a block. */
size_t plan_dsa_warp_smem(int warps, int idx_heads, int idx_dim);
/* dsa_index_score_mma_bf16: the query's A fragments in shared memory, hi + lo, in fragment order:
 * 16-head tiles x 8 k-steps (D_I <= 128) x 32 lanes x 16 bytes x 2. */
#define PLAN_DSA_MMA_SMEM(idx_heads) ((size_t)(((idx_heads) + 15) / 16) * 8 * 32 * 16 * 2)
/* MLA's absorb and expand (kv_b_proj per head): batched bf16 GEMMs (cuBLAS, activations hi + lo)
 * from PLAN_MLA_PROJ_GEMM_MIN_TOKENS tokens for NVFP4 and BF16 kv_b; below, or for other formats,
 * the fp32 kernels that read kv_b once per 8 tokens. */
#define PLAN_MLA_PROJ_GEMM_MIN_TOKENS 16
bool plan_mla_proj_gemm(int n_tokens, enum weight_format kv_b);
/* Whether the plan's "mla_proj" entry (kv_b at one token) is the tensor-core pair
 * (mla_proj_mma_bf16, MOESERVE_CUDA_FORCE included); the fp32 kernels otherwise. */
bool plan_mla_proj_mma(const struct plan *p);
/* The bf16 tensor-core MLA tile (mla_latent_attn_mma_bf16): query hi + lo rows and `stages` key
 * tiles of bf16 rows of plan_mla_mma_ld(k_dim) values (k_dim rounded up to 16, + 8), then an fp8
 * cache's scales of those keys: PLAN_MLA_MMA_SCALE_BLOCKS(k_dim) f32 a key (its latent part has
 * at most that many 128-value blocks; a bf16 cache leaves them unused), then PARTS - 1 areas of
 * 16 x keys f32 a row group (its warps' parts of S meet there). */
#define PLAN_MLA_MMA_SCALE_BLOCKS(k_dim) (((k_dim) + 127) / 128)
/* warps a 16-head row group of that tile: each a quarter of S's dims and of the value columns */
#define PLAN_MLA_MMA_PARTS 4
int plan_mla_mma_ld(int k_dim);
size_t plan_mla_mma_smem(int rows, int keys, int k_dim, int stages);
/* The wgmma MLA tile (mla_latent_attn_wgmma_bf16, cuda_mla_wgmma.cu): 64 head rows (wgmma's M) of
 * query hi + lo, two stages of 32-key tiles, all bf16 of k_dim values; the S exchange between its
 * two warpgroups (16 x 128 f32); an fp8 cache's scales (2 x 32 x PLAN_MLA_MMA_SCALE_BLOCKS). */
#define PLAN_MLA_WGMMA_ROWS 64
#define PLAN_MLA_WGMMA_KEYS 32
/* its one latent shape, DeepSeek-V3's and GLM-5's: 512 latent + 64 rope values a key, the values
 * the first 512 (the k-steps' split between its warpgroups is laid out for it) */
#define PLAN_MLA_WGMMA_DK 576
#define PLAN_MLA_WGMMA_R 512
size_t plan_mla_wgmma_smem(int k_dim);
/* Key splits of one attention launch (decode attention, MLA latent attention): enough splits that
 * `blocks` blocks per split reach two per SM, at most max_splits (the key chunks there are) and
 * PLAN_ATTN_MAX_SPLITS (the kernels' merge workspace). The planner's split_k and the backend's
 * launch both come from it. */
#define PLAN_ATTN_MAX_SPLITS 64
int plan_attention_splits(int sm_count, double blocks, double max_splits);
/* KV chunks for an attention_decode launch of n_seqs sequences whose longest context is max_ctx:
 * enough blocks for two per SM, each chunk a multiple of tile_n. */
int plan_decode_splits(const struct plan *p, int n_seqs, int max_ctx);
/* The most tokens a MoE block runs pair by pair (each (token, slot) pair streaming its expert, no
 * sort) before the sorted grouped GEMM: while the pairs average at most 2 an expert and the
 * experts they read twice or more (uniform routing) come to at most PLAN_MOE_PAIR_REREAD_BYTES,
 * rounded down to a bucket's end (8, 32 or 64), so that a bucket never mixes the two.
 * expert_bytes: one expert's gate + up + down. The bound sits between two measurements (H200):
 * Qwen3-30B-A3B at 32 tokens (~380 MB re-read) ran faster pair by pair, GLM-5 at 64 tokens
 * (~6.1 GB) took 10.7 ms pair by pair for ~4.7 GB of distinct experts. */
#define PLAN_MOE_PAIR_REREAD_BYTES 1e9
int plan_moe_pair_max_tokens(int n_experts, int n_used, double expert_bytes);
/* The rows an expert gets on average from n_tokens tokens under uniform routing (pairs over the
 * distinct experts they reach). */
double plan_moe_rows_per_expert(int n_experts, int n_used, int n_tokens);
/* From 9 tokens the sorted experts in row tiles of 8 tokens on the few-token tensor-core kernel
 * (moe_grouped_mma_bf16), before the pair kernels, while an expert averages at most this many
 * rows: each tile re-reads its expert, and beyond a tile's rows a 64-row GEMM tile is no longer
 * mostly padding. Up to 8 tokens the pairs win (H200, Qwen3-30B: b4 791.3 vs 675.8, b8 940.6 vs
 * 926.5 tok/s; GLM-5 slice b1 0.367 vs 0.403 ms a layer): the sort and the combine cost more
 * than the rows they share. */
#define PLAN_MOE_GROUPED_MAX_ROWS 8.0
#define PLAN_MOE_GROUPED_MIN_TOKENS 9
/* A GPU server's pass: up to this many tokens (decode rows first, then prompt chunks), so that a
 * prompt chunk gives every routed expert about PLAN_PREFILL_ROWS_PER_EXPERT rows (four of the
 * sorted GEMM's 64-row tiles), where the expert GEMMs run near their prefill speed. Smaller
 * passes make a loaded server spend its steps on inefficient chunks: H200, Qwen3-30B NVFP4,
 * serve 512 + 128 at concurrency 64, passes of 512 / 1024 / 2048 / 4096 tokens: 1128.8 / 1504.8
 * / 1734.7 / 1880.0 output tok/s, TPOT 48.4 / 37.6 / 32.9 / 30.1 ms, TTFT p99 5517 / 3296 / 2361
 * / 1854 ms; decode-only TPOT unchanged. Models without experts: PLAN_PREFILL_DENSE_TOKENS.
 * Within [PLAN_PREFILL_MIN_TOKENS, PLAN_PREFILL_MAX_TOKENS]. */
#define PLAN_PREFILL_ROWS_PER_EXPERT 256
#define PLAN_PREFILL_DENSE_TOKENS 2048
#define PLAN_PREFILL_MIN_TOKENS 512
#define PLAN_PREFILL_MAX_TOKENS 8192
int plan_prefill_chunk_tokens(int n_experts, int n_used);
/* Decode graphs (plan_graphs.c): the batch sizes a backend with graphs captures a decode step for,
 * ascending, the last max_rows (a server's --max-seqs, within the forward's logits rows): 1, 2,
 * 4, 8, then steps of max(8, a quarter of the last power of two); a decode batch runs padded up
 * to the next size. Writes at most cap sizes to out; returns how many. */
#define PLAN_MAX_DECODE_GRAPHS 64
int plan_decode_graph_sizes(int max_rows, int *out, int cap);
/* The size a decode batch of n rows is padded to, or 0 when n > max_rows (no graph). */
int plan_decode_graph_rows(int n, int max_rows);
const char *plan_math_name(enum plan_math m);
struct json *plan_caps_to_json(const struct device_caps *caps, size_t smem_budget);
struct json *plan_to_json(const struct plan *p);
void plan_print(const struct plan *p);
/* A backend's kernel table (`moeserve plan --kernels`): name, ops, math, features, formats,
 * compiled tiles, profiler names. */
struct json *plan_kernels_to_json(const struct kernel_table *t);
void plan_kernels_print(const struct kernel_table *t);

#endif
