/* test_comm.c — the collectives interface (backend/comm/comm.h) on one process.
 *
 * comm_all_reduce_add_rmsnorm's reference (a communicator without a fused form for the size: the
 * all-reduce, then the backend's add_rmsnorm) gives the very bits of the two ops called apart,
 * which is what keeps CPU ranks' logits identical to the unfused forward; a communicator whose
 * fused form takes the size runs it alone (nothing else touches the buffers); the single
 * communicator's all-gather of rows and reduce-scatter are copies. The MPI implementations run
 * under mpirun in tests/cli/ranks.sh (2 and 4 ranks = 1 rank). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/comm/comm.h"
#include "test_rand.h"

enum { ROWS = 5, DIM = 96 };

static void fill(float *p, size_t n, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((int64_t)(rng_next(rng) >> 40) - (1 << 23)) / (float)(1 << 22);
}

static void test_reference_is_the_ops_apart(void **state)
{
    (void)state;
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cpu_create(&be, &err), STATUS_OK);
    struct comm c;
    comm_init_single(&c);
    uint64_t rng = 0xc0ffee;
    const size_t n = (size_t)ROWS * DIM;
    float h[ROWS * DIM], delta[ROWS * DIM], w[DIM], h2[ROWS * DIM], d2[ROWS * DIM], x[ROWS * DIM], x2[ROWS * DIM];
    fill(h, n, &rng), fill(delta, n, &rng), fill(w, DIM, &rng);
    memcpy(h2, h, sizeof h), memcpy(d2, delta, sizeof delta);
    assert_false(comm_fuses_add_rmsnorm(&c, n));
    comm_all_reduce_add_rmsnorm(&c, &be, delta, h, w, ROWS, DIM, 1e-6f, x);
    comm_all_reduce_sum(&c, d2, n);
    be.ops->add_rmsnorm(&be, h2, d2, w, ROWS, DIM, 1e-6f, x2);
    assert_memory_equal(h, h2, sizeof h);
    assert_memory_equal(x, x2, sizeof x);
    comm_free(&c);
    backend_destroy(&be);
}

/* A communicator whose fused form takes messages up to 100 floats and marks what it did. */
static int g_fused_calls, g_sum_calls;

static bool fake_fused(struct comm *c, float *delta, float *h, const float *w, int rows, int dim, float eps, float *x)
{
    (void)c, (void)delta, (void)w, (void)eps;
    if ((size_t)rows * (size_t)dim > 100)
        return false;
    g_fused_calls++;
    for (int i = 0; i < rows * dim; i++)
        h[i] = x[i] = 7.0f;
    return true;
}

static bool fake_fuses(const struct comm *c, size_t n)
{
    (void)c;
    return n <= 100;
}

static void fake_sum(struct comm *c, float *buf, size_t n)
{
    (void)c, (void)buf, (void)n;
    g_sum_calls++;
}

static void test_fused_form_runs_alone(void **state)
{
    (void)state;
    struct backend be;
    struct err err = {0};
    assert_int_equal(backend_cpu_create(&be, &err), STATUS_OK);
    static const struct comm_ops FAKE = {.name = "fake", .all_reduce_sum = fake_sum,
                                         .all_reduce_add_rmsnorm = fake_fused, .fuses_add_rmsnorm = fake_fuses};
    struct comm c = {.ops = &FAKE, .rank = 0, .size = 2};
    float h[ROWS * DIM] = {0}, delta[ROWS * DIM], w[DIM], x[ROWS * DIM] = {0};
    for (int i = 0; i < ROWS * DIM; i++)
        delta[i] = 1.0f;
    for (int i = 0; i < DIM; i++)
        w[i] = 1.0f;
    assert_true(comm_fuses_add_rmsnorm(&c, 96));
    comm_all_reduce_add_rmsnorm(&c, &be, delta, h, w, 1, DIM, 1e-6f, x); /* 96 floats: fused */
    assert_int_equal(g_fused_calls, 1);
    assert_int_equal(g_sum_calls, 0);
    assert_true(h[0] == 7.0f && x[95] == 7.0f);
    assert_false(comm_fuses_add_rmsnorm(&c, (size_t)ROWS * DIM));
    comm_all_reduce_add_rmsnorm(&c, &be, delta, h, w, ROWS, DIM, 1e-6f, x); /* 480: apart */
    assert_int_equal(g_fused_calls, 1);
    assert_int_equal(g_sum_calls, 1);
    assert_true(h[0] == 8.0f && x[0] == 1.0f); /* 7 + 1; rmsnorm of a row of eights (rounded) */
    backend_destroy(&be);
}

static void test_single_rows_and_scatter(void **state)
{
    (void)state;
    struct comm c;
    comm_init_single(&c);
    float in[7] = {1, 2, 3, 4, 5, 6, 7}, out[7] = {0};
    comm_all_gather_rows(&c, in, out, 7);
    assert_memory_equal(in, out, sizeof in);
    memset(out, 0, sizeof out);
    comm_reduce_scatter_sum(&c, in, out, 7);
    assert_memory_equal(in, out, sizeof in);
    comm_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_is_the_ops_apart),
        cmocka_unit_test(test_fused_form_runs_alone),
        cmocka_unit_test(test_single_rows_and_scatter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
