/* cuda_kernels.h — the plain C launchers of the CUDA kernels, one .cu per op family.
 *
 * Every launcher enqueues on `stream`, checks its arguments' shapes only as
 * far as a launch needs, and returns the launch's cudaError_t (the caller
 * checks it with CUDA_CHECK). Pointers are device memory unless a comment
 * says otherwise. Templates and kernels stay inside the .cu files.
 *
 * defines: struct cuda_wdev, struct cuda_attn_cfg, enum cuda_gemm_tile,
 *          cuda_embed(), cuda_add(), cuda_silu_mul(), cuda_bias_add(), cuda_f32_to_bf16_split(),
 *          cuda_nvfp4_to_bf16(),
 *          cuda_sum_halves(), cuda_kv_store() (cuda_elementwise.cu); cuda_rmsnorm(), cuda_add_rmsnorm()
 * (cuda_norm.cu); cuda_rope() (cuda_rope.cu); cuda_attention_fit(), cuda_attention_workspace_floats(),
 *          cuda_attention() (cuda_attention.cu); struct cuda_attn_mma_cfg, cuda_attention_mma_smem(),
 *          cuda_attention_mma_fit(), cuda_attention_mma_supported(), cuda_attention_mma()
 *          (cuda_attention_mma.cu); cuda_moe_route() (cuda_moe_route.cu); cuda_router_route()
 *          (cuda_router_route.cu);
 *          cuda_gemm(), cuda_gemm_grouped(), cuda_gemm_tile_rows() (cuda_gemm.cu);
 *          cuda_moe_max_tiles(), cuda_moe_sort(), cuda_moe_combine() (cuda_moe.cu);
 *          cuda_moe_bf16_experts(), cuda_moe_bf16_gather(), cuda_moe_bf16_act(),
 *          cuda_moe_bf16_down_rows() (cuda_moe_bf16.cu);
 *          struct cuda_wgmma_tile, cuda_gemm_wgmma_loadable(), cuda_gemm_wgmma_supported(),
 *          cuda_gemm_wgmma_fit(), cuda_gemm_wgmma_image_bytes(), cuda_gemm_wgmma_image(),
 *          cuda_gemm_wgmma(), cuda_gemm_wgmma_grouped() (cuda_gemm_wgmma.cu);
 *          cuda_gemv1(), cuda_moe_decode() (cuda_decode.cu); cuda_moe_decode_mma()
 *          (cuda_decode_mma.cu); cuda_dec16_shape_ok(), cuda_dec16_pack(), cuda_dec16_smem_bytes(),
 *          cuda_dec16_supported(), cuda_dec16_gemv() (cuda_dec16.cu); cuda_moe_decode_fp8_supported(),
 * cuda_moe_fp8_emulate(), cuda_moe_decode_fp8() (cuda_decode_fp8.cu); struct cuda_layer_decode_args,
 * cuda_layer_decode_supported(), cuda_layer_decode() (cuda_layer_decode.cu); cuda_stream_dense(),
 *          cuda_stream_moe() (cuda_decode_stream.cu); cuda_attn_prep(), cuda_argmax_workspace_bytes(),
 *          cuda_argmax() (cuda_fused.cu);
 *          cuda_mla_store(), cuda_mla_absorb_q(), cuda_mla_expand_o(), cuda_mla_attention_fit(),
 *          cuda_mla_attention_workspace_floats(), cuda_mla_attention() (cuda_mla.cu);
 *          cuda_layernorm(), cuda_dsa_fit(), cuda_dsa_scores(), cuda_dsa_topk() (cuda_dsa.cu)
 */
#ifndef MOESERVE_BACKEND_CUDA_CUDA_KERNELS_H
#define MOESERVE_BACKEND_CUDA_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_gemm_limits.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One weight matrix (or one expert's) as the kernels read it; format and
 * shape are passed beside it. */
struct cuda_wdev {
    const void *data;  /* see enum weight_format */
    const void *scale; /* FP8_BLOCK f32 [ceil(N/128), ceil(K/128)]; NVFP4 e4m3 [N, K/16]; else NULL */
    const float *bias; /* (N) or NULL */
    float scale2;      /* NVFP4 global scale, applied to the fp32 sum; 1 otherwise */
};

/* Byte ranges of device memory (weights the next ops read) that a kernel asks L2 to fetch while
 * it runs: a hint, never a change of results. Each range is fetched in its 16-byte-aligned
 * interior. */
enum { CUDA_L2_MAX_RANGES = 8 };
struct cuda_l2_ranges {
    const void *p[CUDA_L2_MAX_RANGES];
    size_t bytes[CUDA_L2_MAX_RANGES];
    int n;
};


/* ---- cuda_elementwise.cu ---- */
/* out[i, :] = table[tokens[i], :]; table F32, BF16 or F16 [*, dim]. */
cudaError_t cuda_embed(cudaStream_t stream, enum weight_format fmt, const void *table, int64_t dim,
                       const int32_t *tokens, int n, float *out);
/* y[i] += x[i] */
cudaError_t cuda_add(cudaStream_t stream, float *y, const float *x, size_t n);
/* out[i] = silu(gate[i]) * up[i]; out may be gate */
cudaError_t cuda_silu_mul(cudaStream_t stream, const float *gate, const float *up, size_t n, float *out);
/* y[r, n] += bias[n] for y (rows, cols) */
cudaError_t cuda_bias_add(cudaStream_t stream, float *y, const float *bias, int rows, int64_t cols);
/* x[i] ~= hi[i] + lo[i] in bf16: hi = bf16(x), lo = bf16(x - hi) (nearest even; about 16
 * significant bits together, where bf16 alone keeps 8) */
cudaError_t cuda_f32_to_bf16_split(cudaStream_t stream, const float *x, uint16_t *hi, uint16_t *lo, size_t n);
/* out (N x K bf16, row-major) = the NVFP4 weight w's values without its global scale (scale2):
 * exact, since an E2M1 value times an E4M3 scale fits bf16 (K % 16 == 0) */
cudaError_t cuda_nvfp4_to_bf16(cudaStream_t stream, const struct cuda_wdev *w, int64_t N, int64_t K,
                               uint16_t *out);
/* y[r, c] = a[r, c] + b[r, c] (+ bias[c]) for (rows, cols); y may be a */
cudaError_t cuda_sum_halves(cudaStream_t stream, const float *a, const float *b, const float *bias, int rows,
                            int64_t cols, float *y);
/* kv->k[slots[t], :] = k[t, :], same for v; kv is a host struct of device pointers */
cudaError_t cuda_kv_store(cudaStream_t stream, const struct paged_kv *kv, const float *k, const float *v,
                          int n_tokens, const int32_t *slots);

/* ---- cuda_norm.cu ---- */
cudaError_t cuda_rmsnorm(cudaStream_t stream, const float *x, const float *w, int rows, int dim, float eps,
                         float *y);
/* pdl: launched with programmatic dependent launch (device_caps.pdl), see cuda_common.cuh; the
 * same for every launcher below that takes it. */
cudaError_t cuda_add_rmsnorm(cudaStream_t stream, float *h, const float *delta, const float *w, int rows,
                             int dim, float eps, float *y, int pdl);

/* ---- cuda_rope.cu ---- */
/* args is a host struct; args->inv_freq and pos are device pointers. */
cudaError_t cuda_rope(cudaStream_t stream, float *x, int n_tokens, int n_heads, int head_stride,
                      const struct rope_args *args, const int32_t *pos);

/* ---- cuda_attention.cu ---- */
/* A tile configuration of the attention kernel. rows: query rows (token x
 * head of one KV group) per block; keys: keys staged per step. */
struct cuda_attn_cfg {
    int rows;
    int keys;
    int threads;       /* multiple of 32 */
    size_t smem_bytes; /* filled by cuda_attention_fit() */
};
/* Shrinks cfg (keys first, then rows) until its dynamic shared memory for
 * head_dim fits in budget; false if nothing fits. */
int cuda_attention_fit(struct cuda_attn_cfg *cfg, int head_dim, size_t budget);
/* Floats of workspace cuda_attention needs for n_splits > 1 (0 otherwise). */
size_t cuda_attention_workspace_floats(int n_tokens, int n_heads, int head_dim, int n_splits);
/* Causal paged GQA attention (see backend_ops.attention). kv and b are host
 * structs of device pointers. n_splits == 1: the tiled (prefill) kernel
 * writes out directly; n_splits > 1: every block handles one of n_splits key
 * ranges and a second kernel merges the partial softmaxes kept in work. cfg
 * must have passed cuda_attention_fit(). */
cudaError_t cuda_attention(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                           const struct attn_batch *b, int n_heads, float scale, float *out,
                           const struct cuda_attn_cfg *cfg, int n_splits, float *work);

/* ---- cuda_attn_decode.cu (split decode attention, merged by the last split's block) ---- */
/* Whether cuda_attn_decode() takes this shape: group <= 16 query heads per KV head, head_dim a
 * multiple of 4 up to 128, 1..64 splits, its static shared memory within smem_budget. */
int cuda_attn_decode_supported(int group, int head_dim, int n_splits, size_t smem_budget);
/* Like cuda_attention() with n_splits > 1 (work as sized by cuda_attention_workspace_floats),
 * in one kernel: sem holds n_tokens * n_kv_heads zeroed counters and is left zeroed. With pdl,
 * each block reads the batch metadata and its first round of old keys and values
 * before it waits for the kernel before it (keys below pos + 1 - n_tokens: no kernel of the pass
 * writes them). cluster: 1, or CUDA_ATTN_CLUSTER (caps "clusters", n_splits a multiple of it):
 * that many consecutive splits form a thread block cluster and merge in shared memory: push
 * (the splits store their partials into the cluster leader's shared memory,
 * cuda_attn_decode_push_smem bytes a block in all) or pull (the leader loads them from the
 * others'). */
enum { CUDA_ATTN_CLUSTER = 8 };
cudaError_t cuda_attn_decode(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                             const struct attn_batch *b, int n_heads, float scale, float *out, int n_splits,
                             float *work, int *sem, int pdl, int cluster, int push);
/* The shared memory (static and dynamic) of a cuda_attn_decode block with clusters and push. */
size_t cuda_attn_decode_push_smem(int group, int head_dim);

/* ---- cuda_attention_mma.cu (prefill on bf16 tensor cores: "attn_prefill_mma_bf16") ---- */
/* rows: query rows per block (16 per warp, 16..128); keys: keys staged per step (multiple of
 * 16, up to 256); stages 2: the next step's K/V are copied (cp.async) during this one's MMAs,
 * 1: not. */
struct cuda_attn_mma_cfg {
    int rows;
    int keys;
    int stages;
    int prec;          /* 0: q, K, V, P as bf16 hi + lo (fp32-grade); 1: P and V single bf16;
                        * 2: all single bf16 (bf16-grade); 1 and 2 for head_dim 128 only */
    int threads;       /* rows / 16 * 32, set by cuda_attention_mma_fit() */
    size_t smem_bytes; /* set by cuda_attention_mma_fit() */
};
/* Dynamic shared memory of that tile for head_dim (the planner's formula for the variant). */
size_t cuda_attention_mma_smem(int rows, int keys, int head_dim, int stages);
/* Rounds cfg to the kernel's steps, then shrinks it (keys to 32, rows to 64, stages to 1, keys
 * and rows to 16) until it fits budget; false for a head_dim other than 64, 128, 256 or when
 * not even 16 x 16 fits. */
int cuda_attention_mma_fit(struct cuda_attn_mma_cfg *cfg, int head_dim, size_t budget);
/* Whether the kernel takes this head_dim and these pointers (16-byte aligned q and cache). */
int cuda_attention_mma_supported(const float *q, const struct paged_kv *kv, const float *out);
/* As cuda_attention with n_splits == 1, on mma.sync (q, K, V, P split into bf16 hi + lo, fp32
 * accumulation). cfg must have passed cuda_attention_mma_fit() for kv->head_dim. */
cudaError_t cuda_attention_mma(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                               const struct attn_batch *b, int n_heads, float scale, float *out,
                               const struct cuda_attn_mma_cfg *cfg);

/* ---- cuda_ktrace.cu (diagnostics, see cuda_ktrace.cuh) ---- */
/* Writes the kernels' per-block phase records to path (a warning when built without
 * -DMOESERVE_KERNEL_TRACE=ON). */
void cuda_ktrace_dump(const char *path);

/* ---- cuda_router_route.cu (decode: router GEMV + routing in one kernel) ---- */
/* Whether cuda_router_route takes this router and routing (BF16 rows, K % 8 == 0, no groups,
 * tokens x experts <= 4096, their floats within smem_budget). */
int cuda_router_route_supported(const struct weight *router, int n_tokens, const struct route_args *a,
                                size_t smem_budget);
/* Whether the cluster form takes this routing as well (<= 128 experts). */
int cuda_router_route_cluster_supported(const struct route_args *a);
/* Whether cuda_norm_router_route takes these (the cluster form's, K % 4 == 0, K <= 8192, x of K
 * floats in shared memory within smem_budget). */
int cuda_norm_router_route_supported(const struct weight *router, int n_tokens, const struct route_args *a,
                                     size_t smem_budget);
/* h += delta (delta may be NULL), x = rmsnorm(h) * norm_w, then cuda_router_route on x in its
 * cluster form: one kernel, no counter. */
cudaError_t cuda_norm_router_route(cudaStream_t stream, float *h, const float *delta, const float *norm_w, float eps,
                                   const struct weight *router, int n_tokens, const struct route_args *a, float *x,
                                   float *logits, int32_t *ids, float *weights, int pdl);
/* logits = x router^T (+ bias), then ids / weights as cuda_moe_route; count: one device counter,
 * zero before and after the launch (not used by the cluster form). cluster: a thread block
 * cluster per token (caps "clusters", cuda_router_route_cluster_supported). */
cudaError_t cuda_router_route(cudaStream_t stream, const struct weight *router, const float *x, int n_tokens,
                              const struct route_args *a, float *logits, int32_t *ids, float *weights,
                              unsigned *count, int pdl, int cluster);

/* ---- cuda_moe_route.cu ---- */
/* args is a host struct; args->correction_bias is a device pointer (or NULL). */
cudaError_t cuda_moe_route(cudaStream_t stream, const float *logits, int n_tokens,
                           const struct route_args *args, int32_t *ids, float *weights, int pdl);

/* ---- cuda_gemm.cu ---- */
/* Tile shapes of the fp32-FMA GEMM (rows x output features, 256 threads): the
 * planner's fp32 family has tile_m 16, 32 or 64. */
enum cuda_gemm_tile { CUDA_GEMM_16x64, CUDA_GEMM_32x64, CUDA_GEMM_64x64, CUDA_GEMM_TILE_COUNT };
int cuda_gemm_tile_rows(enum cuda_gemm_tile t);
/* y[i, :N] = x[i, :K] W^T (+ bias) for i < m; W in format fmt, read as stored
 * (dequantised in registers, fp32 accumulation). m <= 8 runs a GEMV kernel
 * (one warp per output feature), larger m the tiled kernel. x, y dense. */
cudaError_t cuda_gemm(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w, int64_t N,
                      int64_t K, const float *x, int m, float *y, enum cuda_gemm_tile tile);
/* Grouped GEMM over row tiles: tile i (i < *n_tiles, at most max_tiles) is
 * tiles[3i..3i+2] = {expert, first row, rows}; its rows r read x row
 * (x_rows ? x_rows[r] / x_row_div : r) and write y row r, with the weight
 * table[expert] (device array). */
cudaError_t cuda_gemm_grouped(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                              int64_t N, int64_t K, const float *x, const int32_t *x_rows, int x_row_div,
                              const int32_t *tiles, const int32_t *n_tiles, int max_tiles, float *y,
                              enum cuda_gemm_tile tile);

/* ---- cuda_moe.cu ---- */
/* Upper bound on row tiles for pairs (token, slot) pairs over n_experts. */
int cuda_moe_max_tiles(int pairs, int n_experts, int tile_rows);
/* Counting sort of the pairs by expert: sorted_pair[r] = pair of compact row
 * r (rows grouped by ascending expert), row_of_pair[p] = its row; tiles and
 * *n_tiles as cuda_gemm_grouped wants them. */
cudaError_t cuda_moe_sort(cudaStream_t stream, const int32_t *ids, int pairs, int n_experts, int tile_rows,
                          int32_t *sorted_pair, int32_t *row_of_pair, int32_t *tiles, int32_t *n_tiles,
                          int max_tiles);
/* out[t, :] = sum over the token's slots in ascending expert id of
 * weights[t, j] * y[row_of_pair[t * n_used + j], :] */
cudaError_t cuda_moe_combine(cudaStream_t stream, const int32_t *ids, const float *weights, int n_tokens,
                             int n_used, int dim, const int32_t *row_of_pair, const float *y, float *out);

/* ---- cuda_gemm_mma.cu (bf16 tensor cores; NVFP4 and BF16 weights) ---- */
int cuda_gemm_mma_supported(enum weight_format fmt, int64_t K, const float *x);
/* As cuda_gemm / cuda_gemm_grouped, on mma.sync with activations split into bf16 hi + lo;
 * tile_m 32 or 64 rows (grouped: every tile's rows must fit it). */
cudaError_t cuda_gemm_mma(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w, int64_t N,
                          int64_t K, const float *x, int m, float *y, int tile_m);
cudaError_t cuda_gemm_mma_grouped(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                                  int64_t N, int64_t K, const float *x, const int32_t *x_rows, int x_row_div,
                                  const int32_t *tiles, const int32_t *n_tiles, int max_tiles, float *y,
                                  int tile_m);

/* ---- cuda_gemm_wgmma.cu (Hopper warpgroup MMA, in the sm_90a image only; NVFP4 and BF16 weights) ---- */
/* A tile of the wgmma GEMM: tokens per block (64 or 128), weight rows per block (64 per warpgroup:
 * 128 or 256), k per step (64, or 128 for NVFP4 with K % 128 == 0), and the shared memory it takes
 * (filled by cuda_gemm_wgmma_fit()). */
struct cuda_wgmma_tile {
    int tokens;
    int rows;
    int k;
    int stages; /* x stages in shared memory: 4 keeps two k-steps of x and weights in flight (NVFP4,
                 * 64-wide k, with x's image only; where it fits the budget); else 3, one k-step */
    size_t smem_bytes;
};
/* Whether device runs the wgmma kernels (makes it current): every one has an image for it
 * (cudaFuncGetAttributes) and that image is the sm_90a body (other images hold empty bodies). */
int cuda_gemm_wgmma_loadable(int device);
int cuda_gemm_wgmma_supported(enum weight_format fmt, int64_t K, const float *x);
/* Turns the planned tile t into a compiled one for fmt and K whose shared memory fits budget
 * (smaller k, then fewer tokens; 64-token tiles when rows_hint, the rows of one GEMM or expert,
 * is at most 64); 0 if none fits. */
int cuda_gemm_wgmma_fit(struct cuda_wgmma_tile *t, enum weight_format fmt, int64_t K, double rows_hint,
                        size_t budget);
/* The bytes of x's pre-split image (rows x K, for tile t's k-step) and the image itself: x in the
 * bf16 hi + lo halves and the order the wgmma kernels stage (img 16-byte aligned). The GEMMs
 * below then copy it into shared memory as it is, every block sharing one split. */
size_t cuda_gemm_wgmma_image_bytes(int64_t rows, int64_t K, const struct cuda_wgmma_tile *t);
cudaError_t cuda_gemm_wgmma_image(cudaStream_t stream, const float *x, int64_t rows, int64_t K,
                                  const struct cuda_wgmma_tile *t, void *img);
/* As cuda_gemm_mma / cuda_gemm_mma_grouped (activations split into bf16 hi + lo), on wgmma with a
 * tile fitted by cuda_gemm_wgmma_fit() (grouped: every tile's rows must fit t->tokens). img: x's
 * image for the same tile (cuda_gemm_wgmma_image; the GEMM reads it instead of x), or NULL: every
 * block splits the x rows it reads itself. */
cudaError_t cuda_gemm_wgmma(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w, int64_t N,
                            int64_t K, const float *x, int m, float *y, const struct cuda_wgmma_tile *t,
                            const void *img);
cudaError_t cuda_gemm_wgmma_grouped(cudaStream_t stream, enum weight_format fmt,
                                    const struct cuda_wdev *table, int64_t N, int64_t K, const float *x,
                                    const int32_t *x_rows, int x_row_div, const int32_t *tiles,
                                    const int32_t *n_tiles, int max_tiles, float *y,
                                    const struct cuda_wgmma_tile *t, const void *img);

/* ---- cuda_decode.cu (one activation row: decode) ---- */
/* Whether cuda_gemv1 takes this format, K and x (K splits into 16-byte chunks; x 16-byte aligned;
 * x's K floats fit the block's shared memory). */
int cuda_gemv1_supported(enum weight_format fmt, int64_t K, const float *x, size_t smem_budget);
/* y[j][:N[j]] = x[:K] W_j^T (+ bias) for j < n_w <= 3, every W_j in format fmt: one launch.
 * pdl: launched with programmatic dependent launch (device_caps.pdl), see cuda_common.cuh. */
cudaError_t cuda_gemv1(cudaStream_t stream, enum weight_format fmt, int n_w, const struct cuda_wdev *w,
                       const int64_t *N, int64_t K, const float *x, float *const *y, int pdl);
int cuda_moe_decode_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                              size_t smem_budget);
/* The MoE block for few tokens, pair by pair without a sort: act (n_tokens * n_used, d_expert)
 * = silu(x G_e^T) * (x U_e^T), then out[t] = sum over the token's slots in ascending expert id of
 * weights * (act D_e^T). table as for cuda_gemm_grouped: gate[n_experts], up[...], down[...].
 * pdl as for cuda_gemv1. */
cudaError_t cuda_moe_decode(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                            int n_experts, int64_t d_model, int64_t d_expert, const float *x, int n_tokens,
                            int32_t *ids, float *weights, int n_used, float *act, float *out, int pdl);

/* ---- cuda_decode_mma.cu (few-token kernels on bf16 tensor cores, sm_80+) ---- */
/* Whether cuda_moe_decode_mma takes this shape (NVFP4, both widths multiples of 128). */
int cuda_moe_decode_mma_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                  size_t smem_budget);
/* As cuda_moe_decode (ids and weights read, not routed), NVFP4 only: 8 weight groups (128 k
 * each) in flight a warp. smem_tpw 1 or 2: instead, the form whose weights go through shared
 * memory by cp.async (few registers, every group in flight, each kernel triggering its dependent
 * after its wait), the down kernel's warps taking smem_tpw 8-row tiles each; its weights' data
 * must be 16-byte and their scales 8-byte aligned. 0: the register form. */
cudaError_t cuda_moe_decode_mma(cudaStream_t stream, const struct cuda_wdev *table, int n_experts, int64_t d_model,
                                int64_t d_expert, const float *x, int n_tokens, const int32_t *ids,
                                const float *weights, int n_used, float *act, float *out, int pdl, int smem_tpw);
/* Whether cuda_gemv_mma takes these weights and rows within smem_budget. */
int cuda_gemv_mma_supported(int n_w, const struct cuda_wdev *w, int64_t K, int n_tokens, size_t smem_budget);
/* y[j][t, :N[j]] = x[t, :K] W_j^T for j < n_w <= 3 NVFP4 weights and t < n_tokens <= 8, on bf16
 * tensor cores: the tokens share each mma (rows of its A operand), so 8 tokens cost about what one
 * does. The backend's default for NVFP4 linears of 1-8 rows where the device has mma.sync. */
cudaError_t cuda_gemv_mma(cudaStream_t stream, int n_w, const struct cuda_wdev *w, const int64_t *N,
                          int64_t K, const float *x, int n_tokens, float *const *y, int sm_count, int pdl);

/* ---- cuda_fused.cu ---- */
/* backend_ops.attn_prep: q/k head RMSNorm (q_norm NULL: none), RoPE, K/V into the cache. */
cudaError_t cuda_attn_prep(cudaStream_t stream, float *q, float *k, const float *v, int n_tokens, int n_heads,
                           int n_kv, int head_dim, const float *q_norm, const float *k_norm, float eps,
                           const struct rope_args *a, const int32_t *pos, const struct paged_kv *kv,
                           const int32_t *slots, int pdl);
/* ids[r] = argmax of logits[r, :vocab], lowest id on ties, -1 when the row has a NaN. work
 * (cuda_argmax_workspace_bytes) and sem (rows zeroed counters, left zeroed) let a row be split
 * over blocks; NULL: one block a row. */
size_t cuda_argmax_workspace_bytes(int rows, int vocab);
cudaError_t cuda_argmax(cudaStream_t stream, const float *logits, int rows, int vocab, int32_t *ids, void *work,
                        int *sem);
/* backend_ops.sample; params (rows) device memory. */
cudaError_t cuda_sample(cudaStream_t stream, const float *logits, int rows, int vocab,
                        const struct sample_row *params, int32_t *ids);

/* ---- cuda_mla.cu (glm_moe_dsa MLA over the latent cache; backend_ops.mla_*) ---- */
/* backend_ops.mla_store; kv is a host struct of device pointers. */
cudaError_t cuda_mla_store(cudaStream_t stream, const struct paged_latent *kv, const float *ckv, const float *w,
                           float eps, const float *idx_k, int n_tokens, const int32_t *slots);
/* backend_ops.mla_absorb_q / mla_expand_o with kv_b_proj (format fmt) as w. */
cudaError_t cuda_mla_absorb_q(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w,
                              const struct mla_dims *m, const float *q, int n_tokens, float *q_abs);
cudaError_t cuda_mla_expand_o(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *w,
                              const struct mla_dims *m, const float *o_lat, int n_tokens, float *out);
/* Latent attention tile: rows = heads of one token per block, keys per step; stages 1:
 * queries, accumulators and keys in shared memory, 0: read from global memory. */
struct cuda_mla_cfg {
    int rows;
    int keys;
    int threads;       /* multiple of 32 */
    int stages;        /* 1 staged, 0 unstaged */
    size_t smem_bytes; /* filled by cuda_mla_attention_fit() */
};
/* Shrinks cfg (keys, then rows, then unstaged) until plan_mla_attention_smem() fits budget. */
int cuda_mla_attention_fit(struct cuda_mla_cfg *cfg, int n_heads, int k_dim, int v_dim, size_t budget);
size_t cuda_mla_attention_workspace_floats(int n_tokens, int n_heads, int kv_rank, int n_splits);
/* backend_ops.mla_attention; n_splits > 1: split-K partials in work, then a merge. cfg must
 * have passed cuda_mla_attention_fit() for these dims. */
cudaError_t cuda_mla_attention(cudaStream_t stream, const float *q_abs, const struct paged_latent *kv,
                               const struct attn_batch *b, int n_heads, const int32_t *sel, int sel_k, float scale,
                               float *o_lat, const struct cuda_mla_cfg *cfg, int n_splits, float *work);

/* ---- cuda_dsa.cu (the DSA indexer; backend_ops.layernorm, dsa_select) ---- */
cudaError_t cuda_layernorm(cudaStream_t stream, const float *x, const float *w, const float *b, int rows, int dim,
                           float eps, float *y);
/* The score kernel's tile: keys per block (= threads); stages 1: query and keys staged in
 * shared memory, 0: read from global memory. */
struct cuda_dsa_cfg {
    int keys;
    int stages;
    size_t smem_bytes; /* filled by cuda_dsa_fit() */
};
/* Shrinks keys (multiples of 32), then goes unstaged, until the tile fits budget. */
int cuda_dsa_fit(struct cuda_dsa_cfg *cfg, int idx_heads, int idx_dim, size_t budget);
/* Scores of rows [row0, row0 + n_rows) into scores (n_rows, ctx); rows with pos < topk are
 * skipped. key_blocks blocks per row stride over the keys. */
cudaError_t cuda_dsa_scores(cudaStream_t stream, const float *q_idx, const float *w_idx,
                            const struct paged_latent *kv, const struct attn_batch *b, const struct dsa_args *a,
                            int row0, int n_rows, int ctx, const struct cuda_dsa_cfg *cfg, int key_blocks,
                            float *scores);
/* sel rows [row0, row0 + n_rows) from those scores (backend_ops.dsa_select's contract). */
cudaError_t cuda_dsa_topk(cudaStream_t stream, const float *scores, int ctx, const int32_t *pos, int row0,
                          int n_rows, int topk, int32_t *sel);

/* "moeserve-cuda-archs: 800,900,1000,1200": the families compiled into this binary. */
const char *cuda_build_arch_list(void);

/* ---- cuda_gemm_fp4.cu (W4A4 NVFP4 on block-scaled FP4 mma.sync: "gemm_nvfp4_fp4_mma",
 *      "moe_gemm_nvfp4_fp4_mma"; the GEMM in sm_120a/121a/120f images only, the quantiser anywhere).
 *      NEVER RUN on hardware and not wired into the backend: see the file comment. ----
 * defines: enum cuda_fp4_scale, struct cuda_fp4_act, struct cuda_fp4_tile, cuda_fp4_act_bytes(),
 *          cuda_fp4_act_carve(), cuda_fp4_quantize_supported(), cuda_fp4_quantize(),
 *          cuda_fp4_quantize_host(), cuda_gemm_fp4_loadable(), cuda_gemm_fp4_supported(),
 *          cuda_gemm_fp4_smem(), cuda_gemm_fp4_fit(), cuda_gemm_fp4(), cuda_gemm_fp4_grouped(),
 *          cuda_gemm_fp4_emulate() */
/* The activations' decode global scale: the values and meaning of enum fp4_act_scale
 * (backend/cpu/cpu_fp4_ref.h, the reference that defines the quantisation bit for bit). */
enum cuda_fp4_scale {
    CUDA_FP4_SCALE_TENSOR, /* amax(|x|) of the whole input / (6 * 448) */
    CUDA_FP4_SCALE_ROW,    /* the same per row (batch-invariant) */
    CUDA_FP4_SCALE_STATIC, /* input_scale (a W4A4 checkpoint's), finite and > 0 */
};
/* Activations (rows, K) in NVFP4, carved from one buffer of cuda_fp4_act_bytes(rows, K). */
struct cuda_fp4_act {
    uint8_t *codes;   /* (rows, K/2) e2m1, element 2i in the low nibble */
    uint8_t *scales;  /* (rows, K/16) e4m3 block scales */
    float *row_scale; /* (rows) each row's decode global scale; NaN: the row held a NaN or an Inf */
    uint32_t *amax;   /* (1) scratch of CUDA_FP4_SCALE_TENSOR */
};
size_t cuda_fp4_act_bytes(int rows, int64_t K);
void cuda_fp4_act_carve(void *base, int rows, int64_t K, struct cuda_fp4_act *a);
/* Whether cuda_fp4_quantize takes K (a multiple of 16) and x (16-byte aligned). */
int cuda_fp4_quantize_supported(int64_t K, const float *x);
/* x (rows, K) f32 -> a, bit-exact with fp4_quantize(); input_scale is read by the static mode only. */
cudaError_t cuda_fp4_quantize(cudaStream_t stream, const float *x, int rows, int64_t K,
                              enum cuda_fp4_scale mode, float input_scale, const struct cuda_fp4_act *a);
/* Tests: the quantiser's own arithmetic (the kernel's __host__ __device__ code) run on the host,
 * x and a in host memory (a->amax unused); 0 for arguments cuda_fp4_quantize would refuse. */
int cuda_fp4_quantize_host(const float *x, int rows, int64_t K, enum cuda_fp4_scale mode, float input_scale,
                           const struct cuda_fp4_act *a);
/* A tile of the FP4 GEMM: tokens (64 or 128) x weight rows (64 or 128) x k per stage (64 or 128,
 * dividing K), stages 2..4 in flight; smem_bytes filled by cuda_gemm_fp4_fit(). */
struct cuda_fp4_tile {
    int tokens;
    int rows;
    int k;
    int stages;
    size_t smem_bytes;
};
/* Whether device runs the FP4 GEMM kernels (makes it current): every one has an image for it and
 * that image holds the real body (other images hold empty bodies). */
int cuda_gemm_fp4_loadable(int device);
/* Whether the GEMM takes K (a multiple of 64). Weights: NVFP4 with 16-byte aligned codes and
 * 8-byte aligned scales (cudaMalloc'ed tensors are); x as cuda_fp4_quantize wrote it. */
int cuda_gemm_fp4_supported(int64_t K);
/* Shared memory of a tile (static included): stages x (tokens + rows) x k x 9/16 + 8 x tokens. */
size_t cuda_gemm_fp4_smem(int tokens, int rows, int k, int stages);
/* Turns the planned tile t into a compiled one for K within budget (fewer stages, then k 64, then
 * 64 rows, then 64 tokens; 64 tokens when rows_hint, the rows of one GEMM or expert, is <= 64);
 * 0 if none fits. */
int cuda_gemm_fp4_fit(struct cuda_fp4_tile *t, int64_t K, double rows_hint, size_t budget);
/* y[i, :N] = dequant(x row i) W^T * (x->row_scale[i] * w->scale2) + bias for i < m, W NVFP4,
 * with a tile fitted by cuda_gemm_fp4_fit(). The grouped form walks cuda_gemm_grouped's tile
 * list; compact row r reads x row x_rows[r] / x_row_div (every tile's rows must fit t->tokens). */
cudaError_t cuda_gemm_fp4(cudaStream_t stream, const struct cuda_wdev *w, int64_t N, int64_t K,
                          const struct cuda_fp4_act *x, int m, float *y, const struct cuda_fp4_tile *t);
cudaError_t cuda_gemm_fp4_grouped(cudaStream_t stream, const struct cuda_wdev *table, int64_t N, int64_t K,
                                  const struct cuda_fp4_act *x, const int32_t *x_rows, int x_row_div,
                                  const int32_t *tiles, const int32_t *n_tiles, int max_tiles, float *y,
                                  const struct cuda_fp4_tile *t);
/* Tests: cuda_gemm_fp4 with every pointer in host memory, the kernel's address arithmetic run on
 * the host against a model of ldmatrix and the block-scaled MMA written from the PTX ISA text
 * (not the hardware); 0 for arguments cuda_gemm_fp4 would refuse. */
int cuda_gemm_fp4_emulate(const struct cuda_wdev *w, int64_t N, int64_t K, const struct cuda_fp4_act *x,
                          int m, float *y, const struct cuda_fp4_tile *t);

#ifdef __cplusplus
}
#endif

#endif
