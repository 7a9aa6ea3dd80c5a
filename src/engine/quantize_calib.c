/* quantize_calib.c — see quantize_calib.h.
 *
 * The recording sits between the forward and the CPU backend: a copy of the
 * CPU op table whose linear and moe_experts first note max |x| per weight,
 * then compute exactly as the CPU backend does. The forward is unchanged.
 */
#include "engine/quantize_calib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model_session.h"

struct calib_run {
    struct quantize_calib *c;
    const struct backend_ops *cpu; /* the real ops */
};

static void calib_note(struct quantize_calib *c, const void *data, const float *x, size_t n)
{
    char key[32];
    snprintf(key, sizeof key, "%p", data);
    const char *name = strmap_get(&c->name_by_ptr, key);
    if (!name)
        return;
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    float *slot = strmap_get(&c->amax_by_name, name);
    if (!slot) {
        slot = malloc(sizeof *slot);
        if (!slot)
            return;
        *slot = 0;
        if (!strmap_put(&c->amax_by_name, name, slot, NULL)) {
            free(slot);
            return;
        }
    }
    *slot = fmaxf(*slot, m);
}

static void calib_linear(struct backend *be, const struct weight *w, const float *x, int m, float *y)
{
    struct calib_run *r = be->impl;
    calib_note(r->c, w->data, x, (size_t)m * (size_t)w->cols);
    r->cpu->linear(be, w, x, m, y);
}

/* The CPU algorithm, step by step through the recording linear. */
static void calib_moe_experts(struct backend *be, const float *x, int n_tokens, const int32_t *ids,
                              const float *weights, const struct moe_args *a, float *work, float *out)
{
    size_t D = (size_t)a->d_model, I = (size_t)a->d_expert, K = (size_t)a->n_used;
    float *xg = work, *g = xg + (size_t)n_tokens * K * D, *u = g + (size_t)n_tokens * K * I,
          *y = u + (size_t)n_tokens * K * I;
    memset(out, 0, (size_t)n_tokens * D * sizeof(float));
    for (int e = 0; e < a->n_experts; e++) {
        int cnt = 0;
        for (size_t p = 0; p < (size_t)n_tokens * K; p++)
            if (ids[p] == e)
                memcpy(xg + (size_t)cnt++ * D, x + (p / K) * D, D * sizeof(float));
        if (!cnt)
            continue;
        calib_linear(be, &a->gate[e], xg, cnt, g);
        calib_linear(be, &a->up[e], xg, cnt, u);
        be->ops->silu_mul(be, g, u, cnt, (int)I, g);
        calib_linear(be, &a->down[e], g, cnt, y);
        int i = 0;
        for (size_t p = 0; p < (size_t)n_tokens * K; p++) {
            if (ids[p] != e)
                continue;
            for (size_t d = 0; d < D; d++)
                out[(p / K) * D + d] += weights[p] * y[(size_t)i * D + d];
            i++;
        }
    }
}

enum status quantize_calib_run(struct quantize_calib *c, const char *dir, int n_tokens, unsigned seed,
                               struct err *err)
{
    memset(c, 0, sizeof *c);
    if (!strmap_init(&c->amax_by_name, 1024) || !strmap_init(&c->name_by_ptr, 1024))
        return err_set(err, STATUS_NOMEM, "calibration: out of memory");
    struct model_session s;
    struct session_opts so = {.backend = "cpu", .max_tokens = n_tokens, .max_seqs = 1, .max_context = n_tokens};
    enum status st = model_session_open(&s, dir, &so, err);
    if (st) {
        err_prefix(err, "calibration (needs a model moeserve can run)");
        return st;
    }
    for (size_t i = 0; i < checkpoint_count(&s.ck); i++) {
        const struct st_tensor *t = checkpoint_tensor_at(&s.ck, i);
        char key[32];
        snprintf(key, sizeof key, "%p", t->data);
        strmap_put(&c->name_by_ptr, key, t->name, NULL);
    }
    struct backend_ops ops = *s.be.ops;
    struct calib_run run = {.c = c, .cpu = s.be.ops};
    ops.linear = calib_linear;
    ops.moe_experts = calib_moe_experts;
    const struct backend_ops *saved_ops = s.be.ops;
    void *saved_impl = s.be.impl;
    s.be.ops = &ops;
    s.be.impl = &run;
    int32_t *tok = malloc((size_t)n_tokens * sizeof *tok), *pos = malloc((size_t)n_tokens * sizeof *pos);
    int32_t *seq = calloc((size_t)n_tokens, sizeof *seq);
    float *logits = malloc((size_t)s.desc.vocab_size * sizeof(float));
    uint64_t rng = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 12345;
    for (int i = 0; tok && pos && i < n_tokens; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((rng >> 33) % (uint64_t)s.desc.vocab_size);
        pos[i] = i;
    }
    struct kv_seq ks;
    kv_seq_init(&ks);
    struct kv_seq *seqs[1] = {&ks};
    int32_t last = n_tokens - 1;
    if (!tok || !pos || !seq || !logits)
        st = err_set(err, STATUS_NOMEM, "calibration: out of memory");
    if (!st)
        st = kv_seq_reserve(&ks, &s.kv, n_tokens, err);
    if (!st) {
        struct forward_batch b = {.n_tokens = n_tokens, .tokens = tok, .pos = pos, .seq = seq, .n_seqs = 1,
                                  .seqs = seqs, .n_logits = 1, .logit_rows = &last};
        st = forward_run(&s.fwd, &b, logits, err);
    }
    kv_seq_release(&ks, &s.kv);
    s.be.ops = saved_ops;
    s.be.impl = saved_impl;
    free(tok);
    free(pos);
    free(seq);
    free(logits);
    strmap_free(&c->name_by_ptr); /* its names point into the session's checkpoint */
    model_session_close(&s);
    c->n_tokens = n_tokens;
    return st;
}

float quantize_calib_input_scale(const struct quantize_calib *c, const char *weight_name)
{
    const float *v = c->amax_by_name.cap ? strmap_get(&c->amax_by_name, weight_name) : NULL;
    float amax = v ? *v : 0;
    if (!v) {
        /* an expert nobody chose: the largest of the same projection in the same layer */
        int layer, e;
        char proj[64];
        if (sscanf(weight_name, "model.layers.%d.mlp.experts.%d.%63[a-z_]", &layer, &e, proj) == 3) {
            for (size_t i = 0; i < c->amax_by_name.cap; i++) {
                const struct strmap_slot *sl = &c->amax_by_name.slots[i];
                int l2, e2;
                char p2[64];
                if (sl->key && sscanf(sl->key, "model.layers.%d.mlp.experts.%d.%63[a-z_]", &l2, &e2, p2) == 3 &&
                    l2 == layer && !strcmp(p2, proj))
                    amax = fmaxf(amax, *(const float *)sl->val);
            }
        }
    }
    return amax > 0 ? amax / (6.0f * 448.0f) : 1.0f / (6.0f * 448.0f);
}

void quantize_calib_free(struct quantize_calib *c)
{
    if (c->amax_by_name.cap) {
        for (size_t i = 0; i < c->amax_by_name.cap; i++)
            free(c->amax_by_name.slots[i].val);
        strmap_free(&c->amax_by_name);
    }
    if (c->name_by_ptr.cap)
        strmap_free(&c->name_by_ptr);
    memset(c, 0, sizeof *c);
}
