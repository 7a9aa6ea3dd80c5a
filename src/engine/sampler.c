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
    s->p = *p;
    s->vocab_size = vocab_size;
    s->inc = (p->seed << 1u) | 1u;
    s->state = 0;
    pcg32_next(s);
    s->state += 0x853c49e6748fea9bull ^ p->seed;
    pcg32_next(s);
    s->cand = malloc((size_t)vocab_size * sizeof *s->cand);
    if (!s->cand) {
        sampler_free(s);
        return err_set(err, STATUS_NOMEM, "sampling: out of memory for %d-entry vocabulary", vocab_size);
    }
    return STATUS_OK;
}

void sampler_free(struct sampler *s)
{
    free(s->cand);
    memset(s, 0, sizeof *s);
}

static int cmp_cand_desc(const void *a, const void *b)
{
    const struct sampler_cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->id - y->id;
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
    qsort(s->cand, (size_t)m, sizeof *s->cand, cmp_cand_desc);
    if (s->p.top_k > 0 && m > s->p.top_k)
        m = s->p.top_k;
    double total = 0;
    for (int i = 0; i < m; i++)
        total += s->cand[i].p;
    /* nucleus: the smallest prefix whose mass reaches top_p */
    int keep = m;
    double mass = 0;
    for (int i = 0; i < m; i++) {
        mass += s->cand[i].p;
        if (mass >= (double)s->p.top_p * total) {
            keep = i + 1;
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

float sampler_uniform(struct sampler *s)
{
    return pcg32_uniform(s);
}
