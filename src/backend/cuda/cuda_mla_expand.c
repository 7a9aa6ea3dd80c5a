/* cuda_mla_expand.c — backend_ops.mla_attention_expanded on the GPU: MLA as ordinary attention
 * over K/V expanded from the latent cache, for long dense prompts (the plan's "mla_prefill").
 *
 * Steps, all on the backend's stream: the batch's keys (seq_keys[s] of each block-table row)
 * are gathered from the latent cache into compact f32 rows, whole blocks per row; kv_b turns
 * them into [k_nope_h | v_h] per head (the plan's linear, cuBLAS at these sizes); the rope key
 * joins every head's k_nope in an f32 paged K/V of head dim hd (64, 128 or 256 where the dims
 * fit: the tensor-core prefill kernel's), addressed by a compact block table; then cu_attention
 * (the plan's attention_prefill) runs causal attention of all heads over it. q and the output
 * are padded to hd only when the dims need it (GLM-5: nope + rope = v = 256, no copies).
 *
 * Memory: per key, n_heads * (nope + v + 2 hd) floats (GLM-5: 229 KB), in the backend's expand
 * buffer (not the scratch: the linear and the attention use that one). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend_internal.h"
#include "base/log.h"
#include "plan/plan.h"

static int blocks_of(int keys, int bs)
{
    return keys > 0 ? (keys + bs - 1) / bs : 0;
}

/* The expanded K/V's head dim: the tensor-core prefill kernel's sizes where they fit. */
static int expand_head_dim(const struct mla_dims *m)
{
    int d = m->nope + m->rope > m->v ? m->nope + m->rope : m->v;
    if (d <= 256)
        return d <= 64 ? 64 : d <= 128 ? 128 : 256;
    return (d + 31) / 32 * 32;
}

bool cu_mla_prefers_expanded(struct backend *be, int n_tokens, int64_t n_keys)
{
    struct cuda_backend *c = cuda_ctx(be);
    return plan_mla_prefill_expanded(&c->plan, n_tokens, n_keys);
}

void cu_mla_attention_expanded(struct backend *be, const float *q, const struct weight *kv_b,
                               const struct mla_dims *m, const struct paged_latent *kv,
                               const struct attn_batch *b, int n_seqs, const int32_t *seq_keys, float scale,
                               float *out)
{
    struct cuda_backend *c = cuda_ctx(be);
    if (b->n_tokens <= 0)
        return;
    const int bs = kv->block_size, H = m->n_heads, dq = m->nope + m->rope, hd = expand_head_dim(m);
    int n_blk = 0, t_max = 1;
    for (int s = 0; s < n_seqs; s++) {
        int nb = blocks_of(seq_keys[s], bs);
        n_blk += nb;
        t_max = nb > t_max ? nb : t_max;
    }
    if (n_blk == 0)
        return;
    /* host: block -> (row, index), the rows' keys, the compact block table */
    size_t n_ints = 2 * (size_t)n_blk + (size_t)n_seqs + (size_t)n_seqs * (size_t)t_max;
    int32_t *h = calloc(n_ints, sizeof *h);
    if (!h)
        PANIC("cuda: out of host memory for the MLA expansion of %d blocks", n_blk);
    int32_t *blk_seq = h, *blk_idx = h + n_blk, *keys = blk_idx + n_blk, *table = keys + n_seqs;
    for (int s = 0, o = 0; s < n_seqs; s++) {
        keys[s] = seq_keys[s];
        for (int i = 0; i < blocks_of(seq_keys[s], bs); i++, o++) {
            blk_seq[o] = s, blk_idx[o] = i;
            table[(size_t)s * t_max + i] = o;
        }
    }
    const size_t rows = (size_t)n_blk * (size_t)bs, head_rows = (size_t)m->nope + (size_t)m->v;
    const bool pad_q = hd != dq, pad_o = hd != m->v;
    size_t floats[] = {rows * (size_t)m->kv_rank,     /* gathered latent */
                       rows * (size_t)m->rope,        /* rope keys */
                       rows * (size_t)H * head_rows,  /* kv_b output */
                       rows * (size_t)H * (size_t)hd, /* K */
                       rows * (size_t)H * (size_t)hd, /* V */
                       pad_q ? (size_t)b->n_tokens * H * hd : 0,
                       pad_o ? (size_t)b->n_tokens * H * hd : 0};
    size_t total = 0;
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        total += (floats[i] + 63) / 64 * 64;
    char *buf = cuda_expand_buf_get(c, total * sizeof(float) + n_ints * sizeof(int32_t) + 256);
    if (!buf) {
        free(h);
        return;
    }
    float *part[7];
    size_t off = 0;
    for (int i = 0; i < 7; i++) {
        part[i] = (float *)buf + off;
        off += (floats[i] + 63) / 64 * 64;
    }
    int32_t *dh = (int32_t *)((float *)buf + off);
    CHECK(c, cudaMemcpyAsync(dh, h, n_ints * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    /* the copy from pageable memory has left h when cudaMemcpyAsync returns */
    free(h);
    int32_t *d_blk_seq = dh, *d_blk_idx = dh + n_blk, *d_keys = d_blk_idx + n_blk, *d_table = d_keys + n_seqs;
    if (!CHECK(c, cuda_mla_expand_gather(c->stream, kv, b, d_blk_seq, d_blk_idx, d_keys, (int)rows, part[0],
                                         part[1])))
        return;
    cu_linear(be, kv_b, part[0], (int)rows, part[2]);
    if (!CHECK(c, cuda_mla_expand_assemble(c->stream, part[2], part[1], (int)rows, m, hd, part[3], part[4])))
        return;
    const float *qx = q;
    if (pad_q) {
        if (!CHECK(c, cuda_mla_expand_repad(c->stream, q, b->n_tokens * H, dq, hd, part[5])))
            return;
        qx = part[5];
    }
    struct paged_kv tkv = {.k = part[3], .v = part[4], .block_size = bs, .n_kv_heads = H, .head_dim = hd};
    struct attn_batch tb = {
        .n_tokens = b->n_tokens, .pos = b->pos, .seq = b->seq, .block_table = d_table, .max_blocks = t_max};
    float *o = pad_o ? part[6] : out;
    cu_attention(be, qx, &tkv, &tb, H, scale, o);
    if (pad_o)
        CHECK(c, cuda_mla_expand_repad(c->stream, o, b->n_tokens * H, hd, m->v, out));
}
