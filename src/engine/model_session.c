/* model_session.c — see model_session.h. */
#include "engine/model_session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/forward_dp.h"
#include "model/model_plan.h"
#include "model/synth_preset.h"
#ifdef MOESERVE_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_comm_nccl.h"
#endif

/* This session's ranks: NCCL ranks made here (o->nccl_id), a communicator given (o->comm), or one. */
static void session_ranks(const struct session_opts *o, int *rank, int *size)
{
    *rank = 0, *size = 1;
    if (o && o->nccl_id)
        *rank = o->nccl_rank, *size = o->nccl_size;
    else if (o && o->comm)
        *rank = o->comm->rank, *size = o->comm->size;
}

/* The attention's layout over the ranks: the user's, else the planner's rule for this session's
 * batch (max_seqs sequences) and mean context (max_context / 2), logged with its reason. */
static void session_attention_layout(struct model_session *s, const struct session_opts *o, int size, int max_seqs,
                                     int max_context, enum kv_dtype latent)
{
    if (size <= 1 || o->data_parallel_attention < 0)
        return;
    if (o->data_parallel_attention > 0) {
        s->shard.data_parallel_attention = true;
        LOG_INFO("attention data-parallel over %d ranks (--data-parallel-attention on): weights replicated", size);
        return;
    }
    struct plan_weights pw;
    model_plan_weights(&s->desc, &s->qc, &pw);
    char why[400];
    const double latent_bytes = latent == KV_DTYPE_F32 ? 4.0 : latent == KV_DTYPE_FP8 ? 656.0 / 576.0 : 2.0;
    s->shard.data_parallel_attention = model_shard_choose_attention(
        &s->desc, size, max_seqs, max_context / 2, model_shard_elem_bytes(pw.attn),
        model_shard_cache_elem_bytes(&s->desc, latent_bytes), why, sizeof why);
    if (s->shard.data_parallel_attention)
        LOG_INFO("attention data-parallel over %d ranks: %s", size, why);
    else
        LOG_DEBUG("attention by heads over %d ranks: %s", size, why);
}

/* The rank's share of the model (the whole model without ranks) and its local description, before
 * the backend: a GPU plans for its rank's shapes. The experts' layout where the user chose none:
 * by width while it falls on the format's scale blocks, else by expert where the backend can. */
static enum status session_shard(struct model_session *s, const struct session_opts *o, bool can_mask,
                                 int max_seqs, int max_context, enum kv_dtype latent, struct err *err)
{
    int rank, size;
    session_ranks(o, &rank, &size);
    s->shard = (struct model_shard){.rank = rank, .size = size, .expert_parallel = size > 1 && o->expert_parallel};
    if (size > 1) {
        bool moe = false;
        for (int l = 0; l < s->desc.n_layers; l++)
            moe |= s->desc.layers[l].ffn == FFN_MOE;
        if (o->expert_parallel && !moe)
            return err_set(err, STATUS_INVALID, "--expert-parallel: %s has no routed experts",
                           model_family_name(s->desc.family));
        if (!o->expert_parallel && moe && can_mask) {
            struct plan_weights pw;
            model_plan_weights(&s->desc, &s->qc, &pw);
            const char *why = "";
            s->shard.expert_parallel = model_shard_choose_experts(&s->desc, size, pw.experts, &why);
            if (s->shard.expert_parallel)
                LOG_INFO("routed experts by expert over %d ranks: %s", size, why);
        }
        if (s->shard.expert_parallel && !can_mask)
            return err_set(err, STATUS_UNSUPPORTED, "expert parallelism on the %s backend: not built yet (its "
                           "routed slots cannot be masked); use the width split", o->backend);
        session_attention_layout(s, o, size, max_seqs, max_context, latent);
    } else if (o && o->expert_parallel) {
        return err_set(err, STATUS_INVALID, "--expert-parallel needs more than one rank (--tensor-parallel N)");
    } else if (o && o->data_parallel_attention > 0) {
        return err_set(err, STATUS_INVALID, "--data-parallel-attention on needs more than one rank "
                       "(--tensor-parallel N)");
    }
    return model_shard_desc(&s->desc, &s->shard, &s->local, err);
}

/* The seed of every synthetic model: a preset is one model, the same on every run and rank. */
enum { SESSION_SYNTH_SEED = 1 };

static enum status session_open(struct model_session *s, const char *dir, const struct session_opts *o,
                                struct err *err);

enum status model_session_open(struct model_session *s, const char *dir, const struct session_opts *o,
                               struct err *err)
{
    if (!o || !o->synthetic)
        return session_open(s, dir, o, err);
    /* the loader reads config.json from a directory, as for a checkpoint */
    char tmp[64] = "";
    enum status st = synth_preset_dir(o->synthetic, !o->synthetic_bf16, o->synthetic_layers, NULL, o->tmp_dir, tmp,
                                      err);
    if (!st)
        st = session_open(s, tmp, o, err);
    else
        memset(s, 0, sizeof *s);
    synth_preset_dir_remove(tmp);
    return st;
}

static enum status session_open(struct model_session *s, const char *dir, const struct session_opts *o,
                                struct err *err)
{
    memset(s, 0, sizeof *s);
    struct session_opts def = {.backend = "cpu", .max_tokens = 512, .max_seqs = 1, .max_context = 4096,
                               .block_size = 16};
    if (o) {
        if (o->backend)
            def.backend = o->backend;
        if (o->max_tokens > 0)
            def.max_tokens = o->max_tokens;
        if (o->max_seqs > 0)
            def.max_seqs = o->max_seqs;
        if (o->max_context > 0)
            def.max_context = o->max_context;
        if (o->block_size > 0)
            def.block_size = o->block_size;
    }
    enum status st = model_desc_load(&s->desc, dir, err);
    if (st)
        goto fail;
    if (o && o->check_positions && !o->allow_long_context && s->desc.max_position_embeddings > 0 &&
        def.max_context > s->desc.max_position_embeddings) {
        st = err_set(err, STATUS_INVALID,
                     "a context of %d tokens is past the model's max_position_embeddings (%d): positions it "
                     "never saw; pass --allow-long-context to go on anyway",
                     def.max_context, s->desc.max_position_embeddings);
        goto fail;
    }
    /* before the backend: a CUDA backend plans for these weight formats */
    st = quant_config_load(&s->qc, dir, err);
    if (st)
        goto fail;
    if (o && (o->attention_precision < 0 || o->attention_precision > 2))
        st = err_set(err, STATUS_INVALID, "--attention-precision: expected hi_lo, pv_bf16 or bf16");
    else if (o && o->attention_precision && strcmp(def.backend, "cuda") != 0)
        st = err_set(err, STATUS_UNSUPPORTED, "--attention-precision applies to the cuda backend, not \"%s\"",
                     def.backend);
    int kv_req = o && o->kv_cache_dtype ? kv_dtype_parse(o->kv_cache_dtype) : KV_DTYPE_AUTO;
    if (!st)
        st = kv_cache_check_dtype(&s->desc, kv_req, err);
    if (st)
        goto fail;
    enum kv_dtype latent = kv_cache_latent_dtype(kv_req);
    /* both backends mask other ranks' routed slots (moe_mask_ids) */
    st = session_shard(s, o, strcmp(def.backend, "cpu") == 0 || strcmp(def.backend, "cuda") == 0, def.max_seqs,
                       def.max_context, latent, err);
    if (st)
        goto fail;
    if (latent == KV_DTYPE_FP8 && strcmp(def.backend, "cpu") != 0 &&
        (s->desc.kv_lora_rank % 4 || s->desc.qk_rope_head_dim % 2 || s->desc.index_head_dim % 4)) {
        /* the CUDA kernels read the rows' f32 scales and bf16 rope values in place (cuda_latent.cuh) */
        st = err_set(err, STATUS_UNSUPPORTED,
                     "--kv-cache-dtype fp8 on %s needs kv_lora_rank and index_head_dim multiples of 4 and an even "
                     "qk_rope_head_dim (this model: %d, %d, %d)",
                     def.backend, s->desc.kv_lora_rank, s->desc.index_head_dim, s->desc.qk_rope_head_dim);
        goto fail;
    }
    if (strcmp(def.backend, "cpu") == 0) {
        struct backend_cpu_opts co = {.batch_invariant = o && o->batch_invariant};
        st = backend_cpu_create_opts(&s->be, &co, err);
    } else if (o && o->batch_invariant) {
        st = err_set(err, STATUS_UNSUPPORTED,
                     "batch-invariant mode exists on the cpu backend only (backend \"%s\" sums some rows in "
                     "another order depending on the batch)",
                     def.backend);
#ifdef MOESERVE_HAVE_CUDA
    } else if (strcmp(def.backend, "cuda") == 0) {
        struct plan_weights pw;
        struct plan_shapes ps;
        model_plan_weights(&s->desc, &s->qc, &pw);
        st = model_plan_shapes(&s->local, dir, &ps, err); /* this rank's shapes */
        ps.latent_mma = ps.mla && (latent == KV_DTYPE_BF16 || latent == KV_DTYPE_FP8);
        if (!st)
            st = backend_cuda_create_for(&s->be, o ? o->device : 0, o ? o->smem_budget : 0, &ps, &pw, err);
        if (!st && o && o->nccl_id)
            st = cuda_comm_nccl_init(&s->nccl, &s->be, o->nccl_rank, o->nccl_size, o->nccl_id, !o->collectives_nccl,
                                     err);
        if (!st && o)
            backend_cuda_set_attention_precision(&s->be, o->attention_precision);
    } else {
        st = err_set(err, STATUS_UNSUPPORTED, "backend \"%s\" is not available in this build (have: cpu, cuda)",
                     def.backend);
#else
    } else {
        st = err_set(err, STATUS_UNSUPPORTED, "backend \"%s\" is not available in this build (have: cpu)",
                     def.backend);
#endif
    }
    if (st)
        goto fail;
    if (s->shard.size > 1 && !(o->nccl_id || strcmp(s->be.ops->name, "cpu") == 0)) {
        st = err_set(err, STATUS_UNSUPPORTED, "%d ranks on the %s backend: its ranks are NCCL's, which the "
                     "command starts itself (--tensor-parallel N without mpirun)", s->shard.size, s->be.ops->name);
        goto fail;
    }
    if (o && o->synthetic) {
        LOG_INFO("synthetic %s (%d layers, %s): weights made on the %s backend", o->synthetic, s->desc.n_layers,
                 o->synthetic_bf16 ? "BF16" : "NVFP4", s->be.ops->name);
        st = model_weights_make_shard(&s->w, &s->desc, &s->qc, &s->be, &s->shard, SESSION_SYNTH_SEED, err);
    } else {
        st = checkpoint_open(&s->ck, dir, err);
        if (!st)
            st = model_weights_load_shard(&s->w, &s->desc, &s->ck, &s->qc, &s->be, &s->shard, err);
    }
    if (st)
        goto fail;
    int blocks_per_seq = (def.max_context + def.block_size - 1) / def.block_size;
    int n_blocks = blocks_per_seq * def.max_seqs, pools = 1;
    if (s->shard.data_parallel_attention) {
        /* a pool a rank, each the size one rank's cache would have (so that a request that fits the
         * cache fits a pool): every rank's memory holds its own sequences only, and the ranks together
         * hold ranks x as many */
        pools = s->shard.size;
        LOG_INFO("data-parallel attention: the KV cache in %d pools of %d blocks, one a rank's memory (%d blocks "
                 "in all)", pools, n_blocks, n_blocks * pools);
        n_blocks *= pools;
    }
    st = kv_cache_init_pools(&s->kv, &s->be, &s->local, latent, n_blocks, def.block_size, pools, err);
    if (st)
        goto fail;
    st = forward_init(&s->fwd, &s->local, &s->w, &s->be, &s->kv, def.max_tokens, def.max_seqs, err);
    if (st)
        goto fail;
    if (o && o->nccl_id) /* GPU ranks, one rank too (--tensor-parallel 1: the NCCL path on one GPU) */
        s->fwd.comm = &s->nccl;
    if (s->shard.size > 1) {
        s->fwd.comm = o->nccl_id ? &s->nccl : o->comm;
        if (s->shard.expert_parallel) {
            const struct shard_range ex = model_shard_experts(&s->desc, &s->shard);
            s->fwd.expert_lo = (int)ex.off, s->fwd.expert_hi = (int)(ex.off + ex.n);
        }
        if (s->shard.data_parallel_attention) {
            if ((st = forward_dp_init(&s->fwd, err)))
                goto fail;
            /* the memory figure the layout costs: the whole attention on every rank */
            LOG_INFO("data-parallel attention: %.1f MiB of attention weights on every rank (replicated), %.1f "
                     "MiB for %d ranks' gathered rows",
                     (double)s->w.kinds[WK_ATTENTION].bytes / 1048576.0,
                     2.0 * s->shard.size * def.max_tokens * (double)s->desc.d_model * 4 / 1048576.0, s->shard.size);
        }
    }
    /* every all-reduce followed by a norm goes with its residual add and that norm in one comm op
     * (comm_all_reduce_add_rmsnorm): one kernel where the communicator has a fused form for the size,
     * else the same two ops as apart (CPU ranks: the same bits) */
    s->fwd.fuse_norm = s->fwd.comm != NULL;
    s->max_context = def.max_context;
    return STATUS_OK;
fail:
    model_session_close(s);
    return st;
}

void model_session_close(struct model_session *s)
{
    forward_free(&s->fwd);
    comm_free(&s->nccl); /* before the backend whose stream it uses */
    kv_cache_free(&s->kv);
    model_weights_free(&s->w);
    checkpoint_close(&s->ck);
    backend_destroy(&s->be);
    model_desc_free(&s->local);
    model_desc_free(&s->desc);
    quant_config_free(&s->qc);
    memset(s, 0, sizeof *s);
}
