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

/* The routed experts' weights, which the routing kernel asks L2 for as soon as a token's ids are
 * known (the expert kernels that follow then read them from L2). */
struct cuda_expert_prefetch {
    const struct cuda_wdev *table;        /* 3 x n_experts: gate, up, down (the MoE table) */
    int n_experts;
    size_t data_bytes[3], scale_bytes[3]; /* one expert's gate, up, down: data and scales */
    int blocks;                           /* blocks that share the asking (see cuda_moe_route.cu) */
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
/* Whether cuda_attn_decode_prep takes this shape (as cuda_attn_decode, the RoPE slice inside the
 * head, its own shared memory within smem_budget). */
int cuda_attn_decode_prep_supported(int group, int head_dim, int n_splits, const struct rope_args *rope,
                                    size_t smem_budget);
/* One token: attn_prep (per-head RMSNorm, RoPE, the cache write of the new key and value) and the
 * split decode attention in one kernel. q, k, v: the raw projections (read, not written); work
 * and sem as cuda_attn_decode; rope a host struct (inv_freq a device pointer). */
cudaError_t cuda_attn_decode_prep(cudaStream_t stream, const float *q, const float *k, const float *v,
                                  const struct paged_kv *kv, const struct attn_batch *b, int n_heads,
                                  float scale, float *out, int n_splits, float *work, int *sem,
                                  const float *q_norm, const float *k_norm, float eps,
                                  const struct rope_args *rope, const int32_t *slots, int pdl, int cluster,
                                  int push);
/* Whether cuda_attn_decode_prep takes this shape with cluster = CUDA_ATTN_CLUSTER (caps
 * "clusters"): the cluster's blocks share the norm and RoPE of the group's heads (n_splits a
 * multiple of the cluster, at most 8 query heads a KV head), their shared memory (with push:
 * the push merge's too) within smem_budget. */
int cuda_attn_decode_prep_cluster_supported(int group, int head_dim, int n_splits,
                                            const struct rope_args *rope, int push, size_t smem_budget);
/* Like cuda_attention() with n_splits > 1 (work as sized by cuda_attention_workspace_floats),
 * in one kernel: sem holds n_tokens * n_kv_heads zeroed counters and is left zeroed. prewait:
 * with pdl, each block reads the batch metadata and its first round of old keys and values
 * before it waits for the kernel before it (keys below pos + 1 - n_tokens: no kernel of the pass
 * writes them). cluster: 1, or CUDA_ATTN_CLUSTER (caps "clusters", n_splits a multiple of it):
 * that many consecutive splits form a thread block cluster and merge in shared memory: push
 * (the splits store their partials into the cluster leader's shared memory,
 * cuda_attn_decode_push_smem bytes a block in all) or pull (the leader loads them from the
 * others'). pf (or NULL): weights of the next ops to ask L2 for. */
enum { CUDA_ATTN_CLUSTER = 8 };
cudaError_t cuda_attn_decode(cudaStream_t stream, const float *q, const struct paged_kv *kv,
                             const struct attn_batch *b, int n_heads, float scale, float *out, int n_splits,
                             float *work, int *sem, int pdl, int prewait, int cluster, int push,
                             const struct cuda_l2_ranges *pf);
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
/* pf (or NULL): the routed experts' weights to ask L2 for once the ids are known (one-warp routing
 * only; other shapes ignore it). */
cudaError_t cuda_moe_route(cudaStream_t stream, const float *logits, int n_tokens,
                           const struct route_args *args, int32_t *ids, float *weights, int pdl,
                           const struct cuda_expert_prefetch *pf);

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

/* ---- cuda_moe_bf16.cu (prefill experts through cuBLAS on bf16 copies; see the file) ---- */
/* segs: (expert, first sorted row, rows) per used expert, on the device (cuda_moe_sort's tiles
 * with one tile an expert); a pass covers segments seg0 .. seg0 + n_seg - 1, m_max: their most
 * rows. Activation rows: segment i's hi rows at 2 start_i .., then its lo rows. Experts' NVFP4
 * gate and up as bf16 (2I x D) a segment into wgu, down (D x I) into wd, without the global
 * scales (D, I multiples of 16). */
cudaError_t cuda_moe_bf16_experts(cudaStream_t stream, const struct cuda_wdev *table, int n_experts,
                                  int64_t D, int64_t I, const int32_t *segs, int seg0, int n_seg,
                                  uint16_t *wgu, uint16_t *wd);
/* xb (rows of D bf16) from x's rows of the sorted pairs */
cudaError_t cuda_moe_bf16_gather(cudaStream_t stream, const float *x, int64_t D, const int32_t *sorted_pair,
                                 int n_used, const int32_t *segs, int seg0, int n_seg, int m_max,
                                 uint16_t *xb);
/* ab (rows of I bf16) = silu(gate) * up from y1 (rows of 2I f32: gate, up) */
cudaError_t cuda_moe_bf16_act(cudaStream_t stream, const struct cuda_wdev *table, int n_experts,
                              const float *y1, int64_t I, const int32_t *segs, int seg0, int n_seg, int m_max,
                              uint16_t *ab);
/* yg's sorted rows (D f32) from y2 (rows of D f32: hi + lo), times down's scale2 */
cudaError_t cuda_moe_bf16_down_rows(cudaStream_t stream, const struct cuda_wdev *table, int n_experts,
                                    const float *y2, int64_t D, const int32_t *segs, int seg0, int n_seg,
                                    int m_max, float *yg);

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
/* What a GEMV may do besides y = x W^T (NULL: nothing). */
struct cuda_gemv_fuse {
    const float *norm_w; /* not NULL: x is a residual row; the GEMV reads x' = rmsnorm(x) * norm_w */
    float eps;
    float *x_out;        /* with norm_w, not NULL: x' is also written here (K floats) */
    int residual;        /* y += x W^T instead of y = x W^T (the residual add) */
    /* not NULL: the residual row's pending output (a layer half's delta, K floats with norm_w, N
     * with residual): with norm_w the GEMV reads rmsnorm(x + pending) * norm_w (x is not written:
     * every block reads it), with residual y = (y + pending) + x W^T. The rounding is the
     * composed ops' (add, then norm or add). Not for the stream kernels. */
    const float *pending;
    int rows_per_warp;   /* 2 or 4 for weights of >= 2048 rows (a tuning knob); 0: by shape */
};
/* y[j][:N[j]] = x[:K] W_j^T (+ bias) for j < n_w <= 3, every W_j in format fmt: one launch.
 * pdl: launched with programmatic dependent launch (device_caps.pdl), see cuda_common.cuh. */
cudaError_t cuda_gemv1(cudaStream_t stream, enum weight_format fmt, int n_w, const struct cuda_wdev *w,
                       const int64_t *N, int64_t K, const float *x, float *const *y, int pdl,
                       const struct cuda_gemv_fuse *fuse);
int cuda_moe_decode_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                              size_t smem_budget);
/* Whether cuda_moe_decode can route by itself with these arguments (no groups, <= 256 experts). */
int cuda_moe_decode_can_route(const struct route_args *a);
/* What a MoE decode may do besides the experts (NULL: nothing). */
struct cuda_moe_fuse {
    const float *logits;           /* not NULL: route from these router logits (route: how), */
    const struct route_args *route; /* writing ids and weights instead of reading them */
    int residual;                  /* out += the MoE output instead of out = it */
};
/* The MoE block for few tokens, pair by pair without a sort: act (n_tokens * n_used, d_expert)
 * = silu(x G_e^T) * (x U_e^T), then out[t] = sum over the token's slots in ascending expert id of
 * weights * (act D_e^T). table as for cuda_gemm_grouped: gate[n_experts], up[...], down[...].
 * rows_gate_up (2 or 4) and rows_down (4 or 8): output rows per warp. pdl as for cuda_gemv1. */
cudaError_t cuda_moe_decode(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                            int n_experts, int64_t d_model, int64_t d_expert, const float *x, int n_tokens,
                            int32_t *ids, float *weights, int n_used, float *act, float *out, int rows_gate_up,
                            int rows_down, int pdl, const struct cuda_moe_fuse *fuse);

/* ---- cuda_decode_mma.cu (few-token MoE for NVFP4 experts on bf16 tensor cores, sm_80+) ---- */
/* Whether cuda_moe_decode_mma takes this shape (NVFP4, both widths multiples of 128). */
int cuda_moe_decode_mma_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                  size_t smem_budget);
/* As cuda_moe_decode (ids and weights read, not routed; residual: out +=), NVFP4 only. pf (or
 * NULL): weights of the ops after this one, asked of L2 by the down kernel's blocks. unroll: 4 or
 * 8 weight groups (128 k each) a warp keeps in flight; ks: 1 or 2 warps share a gate/up row tile
 * (K split). smem_tpw 1 or 2: instead, the form whose weights go through shared memory by
 * cp.async (few registers, every group in flight, each kernel triggering its dependent after its
 * wait), the down kernel's warps taking smem_tpw 8-row tiles each (pf, unroll, l2_down and early
 * unused); -1 or -2: only the down kernel in that form (-smem_tpw tiles a warp), gate/up through
 * registers, triggering it after its wait. The weights' data must be 16-byte and their scales
 * 8-byte aligned. */
cudaError_t cuda_moe_decode_mma(cudaStream_t stream, const struct cuda_wdev *table, int n_experts, int64_t d_model,
                                int64_t d_expert, const float *x, int n_tokens, const int32_t *ids,
                                const float *weights, int n_used, float *act, float *out, int residual, int pdl,
                                const struct cuda_l2_ranges *pf, int unroll, int ks, int l2_down, int early,
                                int smem_tpw);
/* The shared-memory form's dynamic shared memory (which 0: gate/up, 1: down), and whether it
 * takes the shape within smem_budget. */
size_t cuda_moe_decode_mma_smem_bytes(int64_t d_model, int64_t d_expert, int tpw, int which);
int cuda_moe_decode_mma_smem_supported(int64_t d_model, int64_t d_expert, int n_used, int tpw, size_t smem_budget);

/* cuda_moe_decode_mma's down kernel alone (register form, unroll 4 or 8), from act (n_tokens x
 * n_used x d_expert) that another gate/up kernel wrote. */
cudaError_t cuda_moe_decode_mma_down(cudaStream_t stream, const struct cuda_wdev *table, int n_experts,
                                     int64_t d_model, int64_t d_expert, int n_tokens, const int32_t *ids,
                                     const float *weights, int n_used, float *act, float *out, int residual,
                                     int pdl, const struct cuda_l2_ranges *pf, int unroll);
/* Whether cuda_moe_decode_mma_routed can route these (route_warp's shapes, the table's E and k). */
int cuda_moe_decode_mma_can_route(const struct route_args *ra, int n_experts, int n_used);
/* As cuda_moe_decode_mma (unroll 8, no K split, no L2 hint), but routing inside the gate/up kernel
 * from the router logits (ra: host struct, its correction bias a device pointer): ids and weights
 * are written for the down kernel (and the caller). */
cudaError_t cuda_moe_decode_mma_routed(cudaStream_t stream, const struct cuda_wdev *table, int n_experts,
                                       int64_t d_model, int64_t d_expert, const float *x, int n_tokens,
                                       const float *logits, const struct route_args *ra, int32_t *ids, float *weights,
                                       int n_used, float *act, float *out, int residual, int pdl);

/* ---- cuda_decode_fp8.cu (few-token NVFP4 MoE on e4m3 tensor cores, sm_89+) ---- */
/* Whether cuda_moe_decode_fp8 takes this shape (NVFP4, both widths multiples of 128). */
int cuda_moe_decode_fp8_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used,
                                  size_t smem_budget);
/* Tests, on the host: one warp's 8 rows (codes: 8 x K/2 bytes, scales: 8 x K/16 E4M3, no global
 * scale) dotted with x[0 .. K) by the kernels' own lane code through a model of the mma: out[n] =
 * row n . x. 0, or -1 for a K that is not a multiple of 128. */
int cuda_moe_fp8_emulate(const uint8_t *codes, const uint8_t *scales, const float *x, int K, float *out);
/* As cuda_moe_decode_mma, x and act in three e4m3 levels (see the file). */
cudaError_t cuda_moe_decode_fp8(cudaStream_t stream, const struct cuda_wdev *table, int n_experts, int64_t d_model,
                                int64_t d_expert, const float *x, int n_tokens, const int32_t *ids,
                                const float *weights, int n_used, float *act, float *out, int residual, int pdl);

/* ---- cuda_layer_decode.cu (one decoder layer of one token in one kernel) ---- */
/* Everything one GQA + routed-MoE layer reads and writes; device pointers. */
struct cuda_layer_decode_args {
    int D, n_heads, n_kv, hd, E, n_used, I, n_splits;
    float eps, attn_scale;
    float *h; /* (D) residual stream, updated in place */
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm;
    struct cuda_wdev wq, wk, wv, wo; /* NVFP4 */
    const void *router;              /* BF16 (E, D) */
    const float *router_bias;        /* (E) or NULL */
    const struct cuda_wdev *experts; /* 3 x E NVFP4: gate, up, down */
    const struct route_args *route;
    const struct rope_args *rope;
    const struct paged_kv *kv;
    const struct attn_batch *batch; /* one token */
    const int32_t *slots;
    float *q, *k, *v, *attn, *logits, *act; /* scratch: QD, KD, KD, QD, E, n_used x I floats */
    float *attn_work;                       /* cuda_attention_workspace_floats(1, n_heads, hd, n_splits) */
    int *sem;                               /* n_kv zeroed counters, left zeroed */
    unsigned *bar;                          /* cuda_layer_decode_barrier_words(), zero before first use */
    unsigned long long *trace;              /* NULL, or a phase trace (cuda_layer_decode_trace) */
};
/* Words of the barrier state (unsigned). */
size_t cuda_layer_decode_barrier_words(void);
/* Entries of a phase trace buffer for up to 4096 launches (zeroed by the caller). */
size_t cuda_layer_decode_trace_entries(void);
/* Mean microseconds of each phase over the launches traced in host copy t (of ..._entries()):
 * out[0 .. 7) = q/k/v, attn_prep, attention, o, router, gate/up, down (barrier included), out[7 ..
 * 13) the part of each but down from the last block's arrival to block 0's leaving (the
 * barrier's own cost; down ends the launch and counts to its last block's end); returns the
 * launches. */
int cuda_layer_decode_trace_summary(const unsigned long long *t, double out[14]);
/* Whether cuda_layer_decode takes the shape (head_dim 128, widths multiples of 128, <= 256
 * experts, k <= 16, <= 16 query heads per KV head; the caller checks formats: NVFP4 projections
 * and experts, BF16 router, softmax routing without groups). */
int cuda_layer_decode_supported(const struct cuda_layer_decode_args *a, size_t smem_budget);
/* Runs the layer on sm_count x min(occupancy, max_per_sm) resident blocks (cooperative launch). */
cudaError_t cuda_layer_decode(cudaStream_t stream, const struct cuda_layer_decode_args *a, int sm_count,
                              int max_per_sm, size_t smem_budget);

/* Whether cuda_gemv_mma takes these NVFP4 weights (K % 128 == 0, x's fragments fit smem_budget;
 * norm: with the RMSNorm fused, K <= 4096). */
int cuda_gemv_mma_supported(int n_w, const struct cuda_wdev *w, int64_t K, int norm, int n_tokens,
                            size_t smem_budget);
/* y[j][t, :N[j]] (+)= x[t, :K] W_j^T for j < n_w <= 3 NVFP4 weights and t < n_tokens <= 8, on bf16
 * tensor cores: the tokens share each mma (rows of its A operand), so 8 tokens cost about what one
 * does. fz (or NULL, one token only): residual (y +=), pending, and norm_w / eps / x_out as for
 * cuda_gemv1 (rows_per_warp is not looked at). The backend's default for NVFP4 linears of 1-8
 * rows where the device has mma.sync. */
cudaError_t cuda_gemv_mma(cudaStream_t stream, int n_w, const struct cuda_wdev *w, const int64_t *N,
                          int64_t K, const float *x, int n_tokens, float *const *y,
                          const struct cuda_gemv_fuse *fz, int sm_count, int pdl);

/* ---- cuda_dec16.cu (one token, NVFP4 from a second copy in the decode layout "dec16") ---- */
/* Whether an N x K NVFP4 weight has a dec16 form (N % 16 == 0, K % 64 == 0). */
int cuda_dec16_shape_ok(int64_t N, int64_t K);
/* Writes the dec16 form of w (checkpoint layout, N x K) into data (N K / 2 bytes, 16-byte
 * aligned) and scale (N K / 16 bytes, 8-byte aligned): the same sizes, reordered. */
cudaError_t cuda_dec16_pack(cudaStream_t stream, const struct cuda_wdev *w, int64_t N, int64_t K, void *data,
                            void *scale);
/* Shared memory of a cuda_dec16_gemv block (x's fragments and the K slices' partials). */
size_t cuda_dec16_smem_bytes(int64_t K);
/* Whether cuda_dec16_gemv takes these weights (w[j].data / .scale: dec16 copies) and x. */
int cuda_dec16_supported(int n_w, const struct cuda_wdev *w, const int64_t *N, int64_t K, const float *x,
                         size_t smem_budget);
/* y[j][:N[j]] = x[:K] W_j^T (+ bias) for one token and j < n_w <= 3 weights in dec16 form. */
cudaError_t cuda_dec16_gemv(cudaStream_t stream, int n_w, const struct cuda_wdev *w, const int64_t *N,
                            int64_t K, const float *x, float *const *y, int sm_count, int pdl);

/* Whether cuda_dec16_moe_gate_up takes this MoE (d_expert % 16 == 0, d_model % 64 == 0, x fits). */
int cuda_dec16_moe_supported(int64_t d_model, int64_t d_expert, int n_used, size_t smem_budget);
/* act[j, :d_expert] = silu(x G_e^T) * (x U_e^T), e = ids[j], for one token's n_used pairs, from
 * the experts' dec16 copies (gate[e], up[e]: n_experts entries each); an id outside [0,
 * n_experts) gives zeros. The down projection: cuda_moe_decode_mma_down. */
cudaError_t cuda_dec16_moe_gate_up(cudaStream_t stream, const struct cuda_wdev *gate,
                                   const struct cuda_wdev *up, int n_experts, int64_t d_model,
                                   int64_t d_expert, const float *x, const int32_t *ids, int n_used,
                                   float *act, int sm_count, int pdl);

/* ---- cuda_decode_stream.cu (one token, one block per SM, weights through shared memory) ---- */
/* Whether the dense stream GEMV takes these weights with `grid` blocks in `smem` bytes a block
 * (NVFP4 with K % 256 == 0, BF16 or F16; 16-byte aligned data, scales and x). */
int cuda_stream_dense_supported(enum weight_format fmt, int n_w, const struct cuda_wdev *w, const int64_t *N,
                                int64_t K, const float *x, int grid, size_t smem);
/* As cuda_gemv1 (fuse: norm prologue and residual add; rows_per_warp ignored), in one wave of
 * `grid` blocks whose weights are copied to shared memory before they wait (pdl). */
cudaError_t cuda_stream_dense(cudaStream_t stream, enum weight_format fmt, int n_w, const struct cuda_wdev *w,
                              const int64_t *N, int64_t K, const float *x, float *const *y,
                              const struct cuda_gemv_fuse *fuse, int grid, size_t smem, int pdl);
/* Whether cuda_stream_moe takes this shape: gate/up in smem_gate_up bytes a block, down in
 * smem_down. */
int cuda_stream_moe_supported(enum weight_format fmt, int64_t d_model, int64_t d_expert, int n_used, int grid,
                              size_t smem_gate_up, size_t smem_down);
/* The MoE block of ONE token: act (n_used, d_expert) = silu(x G_e^T) * (x U_e^T) for e = ids[j],
 * then out (+)= sum over the slots in ascending expert id of weights[j] * (act_j D_e^T). ids and
 * weights must come from a kernel queued before this call (down reads ids before it waits). */
cudaError_t cuda_stream_moe(cudaStream_t stream, enum weight_format fmt, const struct cuda_wdev *table,
                            int n_experts, int64_t d_model, int64_t d_expert, const float *x, const int32_t *ids,
                            const float *weights, int n_used, float *act, float *out, int residual, int grid,
                            size_t smem_gate_up, size_t smem_down, int pdl);

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
