/* rope.c — see rope.h; the YaRN ramp follows spec/models.md section 0.8. */
#include "model/rope.h"

#include <math.h>

void rope_inv_freq(const struct rope_desc *rope, float *inv_freq)
{
    int half = rope->dim / 2;
    float theta = (float)rope->theta;
    for (int i = 0; i < half; i++) {
        float pos_freq = powf(theta, (float)(2 * i) / (float)rope->dim);
        inv_freq[i] = 1.0f / pos_freq;
    }
    if (rope->type != ROPE_TYPE_YARN)
        return;
    /* The dimension index whose wavelength makes `rot` turns over L0 tokens. */
    double d = rope->dim, base = rope->theta, L0 = rope->original_max_pos;
    double lo = d * log(L0 / (rope->beta_fast * 2.0 * M_PI)) / (2.0 * log(base));
    double hi = d * log(L0 / (rope->beta_slow * 2.0 * M_PI)) / (2.0 * log(base));
    if (rope->truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0)
        lo = 0;
    if (hi > d - 1)
        hi = d - 1;
    if (lo == hi)
        hi += 0.001;
    float factor = (float)rope->factor;
    for (int i = 0; i < half; i++) {
        float ramp = (float)(((float)i - (float)lo) / ((float)hi - (float)lo));
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float extrap = 1.0f - ramp;
        float pos_freq = powf(theta, (float)(2 * i) / (float)rope->dim);
        float interp_f = 1.0f / (factor * pos_freq);
        float extrap_f = 1.0f / pos_freq;
        inv_freq[i] = interp_f * (1.0f - extrap) + extrap_f * extrap;
    }
}
