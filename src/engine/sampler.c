/* sampler.c — see sampler.h. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t pcg32_next(struct sampler *s)
{
    uint64_t old = s->state;
    s->state = old * 6364136223846793005ull + s->inc;
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((-rot) & 31));
}

/* Uniform in [0, 1) with 24 random bits. */
static float pcg32_uniform(struct sampler *s)
{
    return (float)(pcg32_next(s) >> 8) * (1.0f / 16777216.0f);
}

enum status sampler_init(struct sampler *s, const struct sampler_params *p, int vocab_size,
                         struct err *err)
{
    memset(s, 0, sizeof *s);
    if (!(p->temperature >= 0) || !(p->top_p > 0 && p->top_p <= 1) || p->top_k < 0)
        return err_set(err, STATUS_INVALID,
                       "sampling: temperature must be >= 0, top_p in (0, 1], top_k >= 0 (got %g, %g, %d)",
                       (double)p->temperature, (double)p->top_p, p->top_k);
    if (!(p->min_p >= 0 && p->min_p <= 1) || !(p->frequency_penalty >= -2 && p->frequency_penalty <= 2) ||
        !(p->presence_penalty >= -2 && p->presence_penalty <= 2) || !(p->repetition_penalty >= 0) ||
        p->n_bias < 0 || p->n_bias > SAMPLER_MAX_BIAS)
        return err_set(err, STATUS_INVALID, "sampling: min_p in [0, 1], frequency and presence penalties in [-2, 2], "
                       "repetition_penalty > 0, at most %d logit_bias entries", SAMPLER_MAX_BIAS);
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= vocab_size || !(p->bias[i] >= -100 && p->bias[i] <= 100))
            return err_set(err, STATUS_INVALID, "sampling: logit_bias: token %d is not in the vocabulary (%d) or "
                           "its bias %g is outside [-100, 100]", (int)p->bias_ids[i], vocab_size, (double)p->bias[i]);
    s->p = *p;
    s->vocab_size = vocab_size;
    s->inc = (p->seed << 1u) | 1u;
    s->state = 0;
    pcg32_next(s);
    s->state += 0x853c49e6748fea9bull ^ p->seed;
    pcg32_next(s);
    s->cand = malloc((size_t)vocab_size * sizeof *s->cand);
    const bool rep = p->repetition_penalty > 0 && p->repetition_penalty != 1;
    if (rep || p->frequency_penalty != 0 || p->presence_penalty != 0)
        s->counts = calloc((size_t)vocab_size, sizeof *s->counts);
    if (rep)
        s->in_prompt = calloc((size_t)vocab_size, 1);
    if (s->counts)
        s->touched = malloc((size_t)vocab_size * sizeof *s->touched);
    if (!s->cand || (rep && (!s->counts || !s->in_prompt)) ||
        ((p->frequency_penalty != 0 || p->presence_penalty != 0) && !s->counts) || (s->counts && !s->touched)) {
        sampler_free(s);
        return err_set(err, STATUS_NOMEM, "sampling: out of memory for %d-entry vocabulary", vocab_size);
    }
    return STATUS_OK;
}

void sampler_free(struct sampler *s)
{
    free(s->cand);
    free(s->counts);
    free(s->in_prompt);
    free(s->touched);
    memset(s, 0, sizeof *s);
}

static int cmp_cand_desc(const void *a, const void *b)
{
    const struct sampler_cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

/* How many of cand[0..m) (sorted, descending) a cut after the first n keeps: n, and every later
 * candidate as likely as the n-th, so that a tie at the cut never depends on the ids' order
 * (transformers' top-k drops only what is below the k-th value; the device sampler keeps ties at
 * each cut too). */
static int cut_with_ties(const struct sampler_cand *cand, int m, int n)
{
    while (n < m && cand[n].p == cand[n - 1].p)
        n++;
    return n;
}

/* The draw among cand[0..m) (their unnormalised probabilities): top-k, min-p, top-p (ties at a
 * cut kept), then the seeded uniform. */
static enum status draw(struct sampler *s, int m, int32_t *token)
{
    qsort(s->cand, (size_t)m, sizeof *s->cand, cmp_cand_desc);
    if (s->p.top_k > 0 && m > s->p.top_k)
        m = cut_with_ties(s->cand, m, s->p.top_k);
    if (s->p.min_p > 0) /* cand[0] is the likeliest; at least it stays */
        for (int i = 1; i < m; i++)
            if (s->cand[i].p < s->p.min_p * s->cand[0].p) {
                m = i;
                break;
            }
    double total = 0;
    for (int i = 0; i < m; i++)
        total += s->cand[i].p;
    /* nucleus: the smallest prefix whose mass reaches top_p */
    int keep = m;
    double mass = 0;
    for (int i = 0; i < m; i++) {
        mass += s->cand[i].p;
        if (mass >= (double)s->p.top_p * total) {
            keep = cut_with_ties(s->cand, m, i + 1);
            break;
        }
    }
    double kept = 0;
    for (int i = 0; i < keep; i++)
        kept += s->cand[i].p;
    double r = (double)pcg32_uniform(s) * kept;
    double acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += s->cand[i].p;
        if (r < acc) {
            *token = s->cand[i].id;
            return STATUS_OK;
        }
    }
    *token = s->cand[keep - 1].id;
    return STATUS_OK;
}

enum status sampler_sample(struct sampler *s, const float *logits, int32_t *token, struct err *err)
{
    int n = s->vocab_size;
    int best = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(logits[i]))
            return err_set(err, STATUS_INVALID, "sampling: logit %d is NaN", i);
        if (logits[i] > logits[best])
            best = i;
    }
    if (s->p.temperature == 0.0f) {
        *token = best;
        return STATUS_OK;
    }
    /* Softmax at temperature over the candidates that can matter (p > 1e-9 of the max). */
    float mx = logits[best];
    float inv_t = 1.0f / s->p.temperature;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float p = expf((logits[i] - mx) * inv_t);
        if (p > 1e-9f)
            s->cand[m++] = (struct sampler_cand){.p = p, .id = i};
    }
    return draw(s, m, token);
}

enum status sampler_sample_masked(struct sampler *s, const float *logits, const uint32_t *allowed, int32_t *token,
                                  struct err *err)
{
    const int n = s->vocab_size, words = (n + 31) / 32;
    int best = -1;
    for (int w = 0; w < words; w++) /* the allowed ids in increasing order, as sampler_sample meets them */
        for (uint32_t b = allowed[w]; b; b &= b - 1) {
            const int i = w * 32 + __builtin_ctz(b);
            if (i >= n)
                break;
            if (isnan(logits[i]))
                return err_set(err, STATUS_INVALID, "sampling: logit %d is NaN", i);
            if (best < 0 || logits[i] > logits[best])
                best = i;
        }
    if (best < 0)
        return err_set(err, STATUS_INVALID, "sampling: no token is allowed");
    if (s->p.temperature == 0.0f) {
        *token = best;
        return STATUS_OK;
    }
    const float mx = logits[best], inv_t = 1.0f / s->p.temperature;
    int m = 0;
    for (int w = 0; w < words; w++)
        for (uint32_t b = allowed[w]; b; b &= b - 1) {
            const int i = w * 32 + __builtin_ctz(b);
            if (i >= n)
                break;
            float p = expf((logits[i] - mx) * inv_t);
            if (p > 1e-9f)
                s->cand[m++] = (struct sampler_cand){.p = p, .id = i};
        }
    return draw(s, m, token);
}

float sampler_uniform(struct sampler *s)
{
    return pcg32_uniform(s);
}

void sampler_observe(struct sampler *s, int32_t token)
{
    if (!s->counts || token < 0 || token >= s->vocab_size)
        return;
    if (s->counts[token]++ == 0 && !(s->in_prompt && s->in_prompt[token]))
        s->touched[s->n_touched++] = token;
}

void sampler_observe_prompt(struct sampler *s, const int32_t *ids, int n)
{
    for (int i = 0; s->in_prompt && i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->vocab_size && !s->in_prompt[ids[i]]) {
            s->in_prompt[ids[i]] = 1;
            if (s->counts[ids[i]] == 0)
                s->touched[s->n_touched++] = ids[i];
        }
}

bool sampler_has_edits(const struct sampler *s)
{
    return s->p.n_bias > 0 || s->counts;
}

struct logit_edit *sampler_edit_slot(struct logit_edit *out, int *n, int cap, int search, int32_t id)
{
    for (int j = 0; j < search && j < *n; j++)
        if (out[j].id == id)
            return &out[j];
    if (*n == cap)
        return NULL;
    out[*n] = (struct logit_edit){.id = id, .rep = 1.0f};
    return &out[(*n)++];
}

int sampler_edits(const struct sampler *s, struct logit_edit *out, int cap)
{
    const struct sampler_params *p = &s->p;
    int n = 0;
    struct logit_edit *e;
    /* logit_bias first (its ids are distinct: a JSON object's keys; a repeated one adds their sum) */
    for (int i = 0; i < p->n_bias; i++) {
        if (!(e = sampler_edit_slot(out, &n, cap, n, p->bias_ids[i])))
            return -1;
        e->pre += p->bias[i];
    }
    /* the touched ids are distinct: only the biased ones can have an edit already */
    const int n_bias = n;
    const float rep = s->in_prompt ? p->repetition_penalty : 1.0f;
    for (int k = 0; k < s->n_touched; k++) {
        const int32_t t = s->touched[k];
        const int c = s->counts[t];
        if (!(e = sampler_edit_slot(out, &n, cap, n_bias, t)))
            return -1;
        if (rep != 1.0f && (c > 0 || s->in_prompt[t]))
            e->rep = rep;
        if (c > 0)
            e->post = -(p->frequency_penalty * (float)c + p->presence_penalty);
    }
    return n;
}

void sampler_apply(const struct sampler *s, float *logits)
{
    const struct sampler_params *p = &s->p;
    for (int i = 0; i < p->n_bias; i++)
        logits[p->bias_ids[i]] += p->bias[i];
    if (!s->counts)
        return;
    const float rep = s->in_prompt ? p->repetition_penalty : 1.0f;
    for (int t = 0; t < s->vocab_size; t++) {
        const int c = s->counts[t];
        if (rep != 1.0f && (c > 0 || s->in_prompt[t]))
            logits[t] = logits[t] > 0 ? logits[t] / rep : logits[t] * rep;
        if (c > 0)
            logits[t] -= p->frequency_penalty * (float)c + p->presence_penalty;
    }
}
