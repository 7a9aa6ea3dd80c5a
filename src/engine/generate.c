/* generate.c — see generate.h. */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "base/timer.h"

static bool is_stop(const struct generate_params *p, int32_t tok)
{
    for (int i = 0; i < p->n_stop; i++)
        if (p->stop_ids[i] == tok)
            return true;
    return false;
}

enum status generate_run(struct model_session *s, const int32_t *prompt, int n_prompt,
                         const struct generate_params *p, generate_token_fn on_token, void *user,
                         struct generate_stats *stats, struct err *err)
{
    memset(stats, 0, sizeof *stats);
    if (n_prompt < 1)
        return err_set(err, STATUS_INVALID, "generate: the prompt is empty");
    if (p->max_new < 0)
        return err_set(err, STATUS_INVALID, "generate: -n must be >= 0");
    if ((long)n_prompt + p->max_new > s->max_context)
        return err_set(err, STATUS_INVALID,
                       "generate: prompt of %d tokens + %d new tokens exceeds the context of %d tokens",
                       n_prompt, p->max_new, s->max_context);
    int V = s->desc.vocab_size;
    int T = s->fwd.max_tokens;
    struct sampler smp;
    enum status st = sampler_init(&smp, &p->sampling, V, err);
    if (st)
        return st;
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    int32_t *seq = calloc((size_t)T, sizeof(int32_t));
    struct kv_seq ks;
    kv_seq_init(&ks);
    struct kv_seq *seqs[1] = {&ks};
    if (!logits || !pos || !seq) {
        st = err_set(err, STATUS_NOMEM, "generate: out of memory");
        goto done;
    }
    /* greedy: the argmax is taken where the logits are (the GPU), only the id comes back */
    bool greedy = p->sampling.temperature == 0.0f;
    /* sampled: drawn by the backend when it can (one id back instead of a row of logits) */
    bool dev_sample = !greedy && forward_can_sample(&s->fwd);
    bool on_dev = greedy || dev_sample;
    struct sample_row sr = {.temperature = p->sampling.temperature, .top_p = p->sampling.top_p,
                            .top_k = p->sampling.top_k};
    int32_t next = 0;
    st = kv_seq_reserve(&ks, &s->kv, n_prompt + p->max_new, err);
    if (st)
        goto done;
    double t0 = timer_now();
    for (int c0 = 0; c0 < n_prompt; c0 += T) {
        int cn = n_prompt - c0 < T ? n_prompt - c0 : T;
        for (int i = 0; i < cn; i++)
            pos[i] = c0 + i;
        int32_t last = cn - 1;
        bool final = c0 + cn == n_prompt;
        struct forward_batch b = {.n_tokens = cn, .tokens = prompt + c0, .pos = pos, .seq = seq,
                                  .n_seqs = 1, .seqs = seqs, .n_logits = final ? 1 : 0,
                                  .logit_rows = &last, .tokens_out = on_dev ? &next : NULL,
                                  .sample = dev_sample ? &sr : NULL};
        if (dev_sample)
            sr.u = sampler_uniform(&smp);
        st = forward_run(&s->fwd, &b, on_dev ? NULL : logits, err);
        if (st)
            goto done;
        ks.n_tokens = c0 + cn;
    }
    stats->n_prompt = n_prompt;
    stats->t_prefill = timer_now() - t0;
    t0 = timer_now();
    for (int i = 0; i < p->max_new; i++) {
        int32_t tok = next;
        if (!on_dev && (st = sampler_sample(&smp, logits, &tok, err)))
            goto done;
        stats->n_generated++;
        bool stop = is_stop(p, tok);
        if (on_token && !on_token(user, tok))
            break;
        if (stop) {
            stats->stopped_by_eos = true;
            break;
        }
        if (i + 1 == p->max_new)
            break;
        int32_t row = 0;
        pos[0] = ks.n_tokens;
        struct forward_batch b = {.n_tokens = 1, .tokens = &tok, .pos = pos, .seq = seq, .n_seqs = 1,
                                  .seqs = seqs, .n_logits = 1, .logit_rows = &row,
                                  .tokens_out = on_dev ? &next : NULL, .sample = dev_sample ? &sr : NULL};
        if (dev_sample)
            sr.u = sampler_uniform(&smp);
        st = forward_run(&s->fwd, &b, on_dev ? NULL : logits, err);
        if (st)
            goto done;
        ks.n_tokens++;
        stats->n_decode_steps++;
    }
    stats->t_decode = timer_now() - t0;
done:
    kv_seq_release(&ks, &s->kv);
    sampler_free(&smp);
    free(logits);
    free(pos);
    free(seq);
    return st;
}
