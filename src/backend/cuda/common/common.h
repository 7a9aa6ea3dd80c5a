/* common.h — the shared device-side type (struct cuda_wdev) and the
 * launchers of the small ops: embedding, elementwise, norms, RoPE, attn_prep, argmax, sampling,
 * the kernel trace, the build's architecture list, synthetic weights.
 *
 * Plain C: every launcher enqueues on `stream`, checks its arguments only as far as a launch
 * needs and returns the launch's cudaError_t (callers check it with CUDA_CHECK); pointers are
 * device memory unless a comment says otherwise. Templates and kernels stay in the .cu files.
 */
#ifndef MOESERVE_BACKEND_CUDA_COMMON_COMMON_H
#define MOESERVE_BACKEND_CUDA_COMMON_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "format/weight_synth.h"

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
/* pdl: launched with programmatic dependent launch (device_caps.pdl), see cuda_common.cuh; the
 * same for every launcher below that takes it. */
cudaError_t cuda_rmsnorm(cudaStream_t stream, const float *x, const float *w, int rows, int dim, float eps,
                         float *y, int pdl);
cudaError_t cuda_add_rmsnorm(cudaStream_t stream, float *h, const float *delta, const float *w, int rows,
                             int dim, float eps, float *y, int pdl);

/* ---- cuda_rope.cu ---- */
/* args is a host struct; args->inv_freq and pos are device pointers. */
cudaError_t cuda_rope(cudaStream_t stream, float *x, int n_tokens, int n_heads, int head_stride,
                      const struct rope_args *args, const int32_t *pos, int pdl);
/* jobs: host array of n_jobs <= ROPE_MAX_JOBS (args->offset unused: each job's own) */
cudaError_t cuda_rope_multi(cudaStream_t stream, int n_jobs, const struct rope_job *jobs, int n_tokens,
                            const struct rope_args *args, const int32_t *pos, int pdl);

/* ---- cuda_ktrace.cu (diagnostics, see cuda_ktrace.cuh) ---- */
/* Writes the kernels' per-block phase records to path (a warning when built without
 * -DMOESERVE_KERNEL_TRACE=ON). */
void cuda_ktrace_dump(const char *path);

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
/* backend_ops.sample; params (rows) and masks device memory. */
cudaError_t cuda_sample(cudaStream_t stream, const float *logits, int rows, int vocab,
                        const struct sample_row *params, const uint32_t *masks, int32_t *ids);
/* backend_ops.logprobs; every pointer device memory. */
cudaError_t cuda_logprobs(cudaStream_t stream, const float *logits, int rows, int vocab,
                          const struct sample_row *params, const uint32_t *masks, const int32_t *ids, int k, float *lp,
                          int32_t *top_ids, float *top_lp);
/* backend_ops.logits_edit; start (rows + 1) and edits device memory. */
cudaError_t cuda_logits_edit(cudaStream_t stream, float *logits, int rows, int vocab, const int32_t *start,
                             const struct logit_edit *edits);

/* ---- cuda_weight_synth.cu ---- */
/* The share s of a synthetic weight (format/weight_synth.h) into data (and scale for NVFP4), rows x
 * cols of format fmt (BF16, F32, NVFP4): the bytes weight_synth_fill makes on the host. */
cudaError_t cuda_weight_synth(cudaStream_t stream, enum weight_format fmt, const struct weight_synth *s,
                              int64_t rows, int64_t cols, void *data, void *scale);

/* ---- cuda_build_info.cu ---- */
/* "moeserve-cuda-archs: 800,900,1000,1200": the families compiled into this binary. */
const char *cuda_build_arch_list(void);

#ifdef __cplusplus
}
#endif

#endif
