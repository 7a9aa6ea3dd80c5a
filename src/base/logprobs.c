/* logprobs.c — see logprobs.h. */
#include "base/logprobs.h"

#include <math.h>

static float masked(const float *x, const uint32_t *mask, int i)
{
    return !mask || (mask[i >> 5] >> (i & 31)) & 1u ? x[i] : -INFINITY;
}

float logprobs_row(const float *x, int V, const uint32_t *mask, int32_t tok, int k, int32_t *top_ids, float *top_lp)
{
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        mx = masked(x, mask, i) > mx ? masked(x, mask, i) : mx;
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)(masked(x, mask, i) - mx));
    const float lse = mx + (float)log(sum);
    int n = 0;
    for (int i = 0; i < V && k > 0; i++) {
        const float v = masked(x, mask, i);
        if (n == k && v <= masked(x, mask, top_ids[n - 1]))
            continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && masked(x, mask, top_ids[j - 1]) < v) {
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_ids[j] = i;
    }
    for (int j = 0; j < n; j++)
        top_lp[j] = masked(x, mask, top_ids[j]) - lse;
    return masked(x, mask, tok) - lse;
}
