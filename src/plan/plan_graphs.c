/* plan_graphs.c — the batch sizes a backend captures decode steps for (see plan.h).
 *
 * A decode step of n sequences runs as the captured graph of the smallest size >= n, its extra
 * rows padding (engine/forward.c). One graph per size the scheduler happens to form (up to
 * --max-seqs of them, each in every sampling mode) held the GPU server's host memory growing
 * over a soak; a fixed, short list bounds it. The list: 1, 2, 4, 8, then steps of a quarter of
 * the last power of two (at least 8): every size up to 64 pads at most 7 rows, above it at most
 * ~20% of the batch, and 256 rows take 19 sizes. The largest size is always max_rows itself.
 * Deliberately not here: which passes are decode-shaped (forward.c decides).
 */
#include "plan/plan.h"

int plan_decode_graph_sizes(int max_rows, int *out, int cap)
{
    int n = 0, b = 1;
    while (b < max_rows && n < cap - 1) {
        out[n++] = b;
        int pow2 = 1;
        while (pow2 * 2 <= b)
            pow2 *= 2;
        int step = b < 8 ? b : pow2 / 4 > 8 ? pow2 / 4 : 8;
        b += step;
    }
    if (max_rows >= 1 && n < cap)
        out[n++] = max_rows;
    return n;
}

int plan_decode_graph_rows(int n, int max_rows)
{
    int sizes[PLAN_MAX_DECODE_GRAPHS];
    int k = plan_decode_graph_sizes(max_rows, sizes, PLAN_MAX_DECODE_GRAPHS);
    for (int i = 0; i < k; i++)
        if (sizes[i] >= n)
            return sizes[i];
    return 0;
}
