/* model_session.h — everything needed to run one model on one backend.
 *
 * Opens the checkpoint directory, parses config.json, creates the backend,
 * binds the weights, takes a paged KV cache and the forward's buffers. The
 * CLI commands, the tests and (later) the server all start here.
 *
 * defines: struct session_opts, struct model_session, model_session_open(),
 *          model_session_close()
 */
#ifndef MOESERVE_ENGINE_MODEL_SESSION_H
#define MOESERVE_ENGINE_MODEL_SESSION_H

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "format/checkpoint.h"
#include "model/model_desc.h"
#include "model/model_shard.h"
#include "model/model_weights.h"

struct session_opts {
    const char *backend; /* "cpu" (default) */
    int max_tokens;      /* largest batch of tokens one forward takes; default 512 */
    int max_seqs;        /* sequences in flight; default 1 */
    int max_context;     /* tokens per sequence the cache must hold; default 4096 */
    int block_size;      /* KV block size in tokens; default 16 */
    size_t smem_budget;  /* cuda: shared-memory bytes per block the plan may use (--smem-budget);
                            0 = MOESERVE_SMEM_BUDGET or the device's own */
    bool batch_invariant; /* cpu: a token's results never depend on the rest of its batch
                             (struct backend_cpu_opts); refused on other backends */
    const char *kv_cache_dtype; /* MLA latent cache: "bf16" (NULL: the default), "f32" for reference runs;
                                   "fp8" is refused until it exists (--kv-cache-dtype) */
    bool check_positions;   /* refuse a max_context past the model's max_position_embeddings (the CLI's
                               commands; tests and benchmarks size caches, not positions) ... */
    bool allow_long_context; /* ... unless asked to (--allow-long-context) */
    int attention_precision; /* cuda: prefill tensor-core attention operands: 0 bf16 hi + lo (fp32-grade), 1 P and
                                V single bf16, 2 all single bf16 (faster, bf16-grade; --attention-precision) */
    struct comm *comm;       /* borrowed: the ranks this session is one of (tensor parallelism over comm->size
                                ranks: --tensor-parallel); NULL or one rank: the whole model */
    bool expert_parallel;    /* with ranks: routed experts partitioned by expert (--expert-parallel) */
    int data_parallel_attention; /* with ranks: 1 each rank attends for its own sequences (the attention
                                    replicated), -1 by heads, 0 the planner's rule for max_seqs sequences of
                                    max_context / 2 tokens (model_shard_choose_attention;
                                    --data-parallel-attention on|off|auto) */
    int device;              /* cuda: the GPU (a GPU rank's own) */
    const uint8_t *nccl_id;  /* cuda: GPU ranks: the session joins rank nccl_rank of nccl_size over NCCL
                                (cuda_comm_nccl.h) with this id (CUDA_NCCL_ID_BYTES); NULL: comm above */
    int nccl_rank, nccl_size;
    bool collectives_nccl;   /* GPU ranks: NCCL's all-reduce at every size (--collectives nccl); else the P2P
                                kernels where the start-up measurement chose them (cuda_comm_p2p.h) */
    const char *synthetic;  /* a preset's name (model/synth_preset.h): no checkpoint, `dir` unused; the preset's
                               config in a temporary directory while the session opens, every weight made
                               on the backend (model_weights_make_shard): bench --synthetic */
    bool synthetic_bf16;    /* the preset's weights all BF16 (default: NVFP4 as `moeserve quantize` writes) */
    int synthetic_layers;   /* > 0: that many of the preset's layers */
    const char *tmp_dir;    /* where the preset's temporary directory goes (NULL: /tmp) */
};

struct model_session {
    struct checkpoint ck;
    struct model_desc desc;  /* the whole model's description */
    struct model_desc local; /* this rank's share (model_shard_desc): what the forward and the KV cache run */
    struct model_shard shard;
    struct comm nccl;        /* the GPU ranks' communicator when session_opts.nccl_id made one */
    struct quant_config qc;
    struct backend be;
    struct model_weights w;
    struct kv_cache kv;
    struct forward fwd;
    int max_context;
};

enum status model_session_open(struct model_session *s, const char *dir, const struct session_opts *o,
                               struct err *err);
/* Safe on a zeroed struct. */
void model_session_close(struct model_session *s);

#endif
