/* test_checkpoint.c — checkpoint directories: single file, index.json shards,
 * a plain set of *.safetensors, and every way an index can lie (missing
 * shard, tensor not in its shard, path traversal, a tensor in two shards).
 * Each test builds its own subdirectory of one mkdtemp'ed root.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "format/checkpoint.h"

/* snprintf that fails the test instead of truncating a path. */
static void fmt(char *out, size_t size, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *out, size_t size, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(out, size, f, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < size);
}

struct fixture {
    char root[4096]; /* mkdtemp'ed, removed at teardown */
};

static int fixture_setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(fx->root, sizeof fx->root, "%s/ckpt_test_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fx->root)) {
        free(fx);
        return -1;
    }
    log_set_level(LOG_LEVEL_WARN); /* no progress lines in test output */
    *state = fx;
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static int fixture_teardown(void **state)
{
    struct fixture *fx = *state;
    nftw(fx->root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(fx);
    return 0;
}

/* Makes root/name and returns it in out. */
static void make_dir(const struct fixture *fx, const char *name, char *out, size_t out_size)
{
    fmt(out, out_size, "%s/%s", fx->root, name);
    assert_int_equal(mkdir(out, 0700), 0);
}

static void write_bytes(const char *dir, const char *name, const void *bytes, size_t len)
{
    char path[4200];
    fmt(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(bytes, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

static void write_text(const char *dir, const char *name, const char *text)
{
    write_bytes(dir, name, text, strlen(text));
}

/* Writes dir/file holding F32 scalars named by the NULL-terminated list;
 * tensor i holds the value (float)(first_value + i). */
static void write_shard(const char *dir, const char *file, const char *const *names,
                        int first_value)
{
    char header[4096];
    float data[64];
    size_t hl = 0, n = 0;
    for (; names[n]; n++) {
        assert_true(n < 64);
        int w = snprintf(header + hl, sizeof header - hl,
                         "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[%zu,%zu]}",
                         n ? "," : "{", names[n], 4 * n, 4 * n + 4);
        assert_true(w > 0 && (size_t)w < sizeof header - hl);
        hl += (size_t)w;
        data[n] = (float)(first_value + (int)n);
    }
    snprintf(header + hl, sizeof header - hl, "%s", n ? "}" : "{}");
    hl = strlen(header);

    char path[4200];
    fmt(path, sizeof path, "%s/%s", dir, file);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    assert_int_equal(fwrite(len, 1, 8, fp), 8);
    assert_int_equal(fwrite(header, 1, hl, fp), hl);
    if (n)
        assert_int_equal(fwrite(data, 4, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

static float scalar_value(const struct st_tensor *t)
{
    float v;
    assert_int_equal(t->n_bytes, 4);
    memcpy(&v, t->data, 4);
    return v;
}

/* Opens dir and checks the failure: status and substrings of the message. */
static void expect_fail(const char *dir, enum status code, const char *want1, const char *want2)
{
    struct checkpoint c = {0};
    struct err err = {0};
    enum status st = checkpoint_open(&c, dir, &err);
    if (st != code || (want1 && !strstr(err.msg, want1)) || (want2 && !strstr(err.msg, want2)))
        fail_msg("%s: got status %d (want %d), message \"%s\" (want \"%s\", \"%s\")", dir, st,
                 code, err.msg, want1 ? want1 : "", want2 ? want2 : "");
    assert_null(c.files);
    assert_int_equal(c.n_files, 0);
    checkpoint_close(&c);
}

static const char *const SHARD1[] = {"model.embed_tokens.weight", "model.norm.weight", NULL};
static const char *const SHARD2[] = {"lm_head.weight", NULL};
static const char *const INDEX_OK =
    "{\"metadata\":{\"total_size\":12},\"weight_map\":{"
    "\"lm_head.weight\":\"model-00002-of-00002.safetensors\","
    "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
    "\"model.norm.weight\":\"model-00001-of-00002.safetensors\"}}";

static void test_single_file(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "single", dir, sizeof dir);
    write_shard(dir, "model.safetensors", SHARD1, 10);
    write_shard(dir, "other.safetensors", SHARD2, 0); /* ignored: model.safetensors wins */

    struct checkpoint c = {0};
    struct err err = {0};
    assert_int_equal(checkpoint_open(&c, dir, &err), STATUS_OK);
    assert_int_equal(c.n_files, 1);
    assert_int_equal(checkpoint_count(&c), 2);
    assert_true(c.total_bytes > 8);
    const struct st_tensor *t = checkpoint_find(&c, "model.norm.weight");
    assert_non_null(t);
    assert_true(scalar_value(t) == 11.0f);
    assert_non_null(strstr(t->file, "model.safetensors"));
    assert_null(checkpoint_find(&c, "lm_head.weight"));
    assert_string_equal(checkpoint_tensor_at(&c, 0)->name, "model.embed_tokens.weight");
    assert_string_equal(checkpoint_tensor_at(&c, 1)->name, "model.norm.weight");
    assert_null(checkpoint_tensor_at(&c, 2));
    checkpoint_close(&c);
    assert_null(c.dir);
    checkpoint_close(&c); /* safe on a zeroed struct */
}

static void test_sharded_index(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "sharded", dir, sizeof dir);
    write_shard(dir, "model-00001-of-00002.safetensors", SHARD1, 10);
    write_shard(dir, "model-00002-of-00002.safetensors", SHARD2, 20);
    write_text(dir, "model.safetensors.index.json", INDEX_OK);

    struct checkpoint c = {0};
    struct err err = {0};
    assert_int_equal(checkpoint_open(&c, dir, &err), STATUS_OK);
    assert_int_equal(c.n_files, 2);
    assert_int_equal(checkpoint_count(&c), 3);
    const struct st_tensor *t = checkpoint_find(&c, "lm_head.weight");
    assert_non_null(t);
    assert_non_null(strstr(t->file, "model-00002-of-00002.safetensors"));
    assert_true(scalar_value(t) == 20.0f);
    t = checkpoint_find(&c, "model.embed_tokens.weight");
    assert_non_null(t);
    assert_true(scalar_value(t) == 10.0f);
    /* Files in name order, tensors in header order. */
    assert_string_equal(checkpoint_tensor_at(&c, 0)->name, "model.embed_tokens.weight");
    assert_string_equal(checkpoint_tensor_at(&c, 1)->name, "model.norm.weight");
    assert_string_equal(checkpoint_tensor_at(&c, 2)->name, "lm_head.weight");
    assert_null(checkpoint_tensor_at(&c, 3));
    for (size_t i = 0; i < checkpoint_count(&c); i++) {
        const struct st_tensor *u = checkpoint_tensor_at(&c, i);
        assert_ptr_equal(checkpoint_find(&c, u->name), u);
    }
    checkpoint_close(&c);
}

static void test_scan_dir(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "scan", dir, sizeof dir);
    write_shard(dir, "b.safetensors", SHARD2, 20);
    write_shard(dir, "a.safetensors", SHARD1, 10);
    write_text(dir, "config.json", "{}");
    write_text(dir, ".hidden.safetensors", "not a safetensors file");

    struct checkpoint c = {0};
    struct err err = {0};
    assert_int_equal(checkpoint_open(&c, dir, &err), STATUS_OK);
    assert_int_equal(c.n_files, 2);
    assert_int_equal(checkpoint_count(&c), 3);
    assert_string_equal(checkpoint_tensor_at(&c, 2)->name, "lm_head.weight"); /* b after a */
    checkpoint_close(&c);
}

static void test_index_missing_shard(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "missing_shard", dir, sizeof dir);
    write_shard(dir, "model-00001-of-00002.safetensors", SHARD1, 10);
    write_text(dir, "model.safetensors.index.json", INDEX_OK);
    char want[4400];
    fmt(want, sizeof want,
             "model.safetensors.index.json names shard model-00002-of-00002.safetensors but "
             "%s/model-00002-of-00002.safetensors is missing",
             dir);
    expect_fail(dir, STATUS_NOT_FOUND, want, NULL);
}

static void test_index_tensor_not_in_shard(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "absent_tensor", dir, sizeof dir);
    write_shard(dir, "model-00001-of-00002.safetensors", SHARD1, 10);
    static const char *const other[] = {"something.else", NULL};
    write_shard(dir, "model-00002-of-00002.safetensors", other, 20);
    write_text(dir, "model.safetensors.index.json", INDEX_OK);
    expect_fail(dir, STATUS_FORMAT, "tensor lm_head.weight: not in shard",
                "model-00002-of-00002.safetensors");
}

static void test_index_wrong_shard(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "wrong_shard", dir, sizeof dir);
    write_shard(dir, "model-00001-of-00002.safetensors", SHARD1, 10);
    write_shard(dir, "model-00002-of-00002.safetensors", SHARD2, 20);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{"
               "\"lm_head.weight\":\"model-00001-of-00002.safetensors\","
               "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}");
    expect_fail(dir, STATUS_FORMAT, "tensor lm_head.weight: not in shard", "found in");
}

static void test_tensor_in_two_shards(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "two_shards", dir, sizeof dir);
    write_shard(dir, "model-00001-of-00002.safetensors", SHARD1, 10);
    static const char *const dup[] = {"lm_head.weight", "model.norm.weight", NULL};
    write_shard(dir, "model-00002-of-00002.safetensors", dup, 20);
    write_text(dir, "model.safetensors.index.json", INDEX_OK);
    expect_fail(dir, STATUS_FORMAT, "tensor model.norm.weight is in both", NULL);

    /* Same without an index. */
    make_dir(fx, "two_files", dir, sizeof dir);
    write_shard(dir, "a.safetensors", SHARD1, 10);
    write_shard(dir, "b.safetensors", dup, 20);
    expect_fail(dir, STATUS_FORMAT, "tensor model.norm.weight is in both", "a.safetensors");
}

static void test_index_path_traversal(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "traversal", dir, sizeof dir);
    /* A valid shard sits one level up: the index must not reach it. */
    write_shard(fx->root, "evil.safetensors", SHARD2, 0);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"lm_head.weight\":\"../evil.safetensors\"}}");
    expect_fail(dir, STATUS_FORMAT, "tensor lm_head.weight: invalid shard name",
                "\"../evil.safetensors\"");

    char path[4400];
    fmt(path, sizeof path,
             "{\"weight_map\":{\"lm_head.weight\":\"%s/evil.safetensors\"}}", fx->root);
    write_text(dir, "model.safetensors.index.json", path);
    expect_fail(dir, STATUS_FORMAT, "invalid shard name", NULL);

    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"lm_head.weight\":\"..\"}}");
    expect_fail(dir, STATUS_FORMAT, "invalid shard name", NULL);

    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{\"lm_head.weight\":\"\"}}");
    expect_fail(dir, STATUS_FORMAT, "invalid shard name", NULL);
}

static void test_index_malformed(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "bad_index", dir, sizeof dir);
    write_shard(dir, "model.safetensors", SHARD1, 10);
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":");
    expect_fail(dir, STATUS_FORMAT, "model.safetensors.index.json", "malformed JSON");
    write_text(dir, "model.safetensors.index.json", "{\"metadata\":{}}");
    expect_fail(dir, STATUS_FORMAT, "model.safetensors.index.json", "weight_map");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":{}}");
    expect_fail(dir, STATUS_FORMAT, "model.safetensors.index.json", "empty");
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"model.norm.weight\":3}}");
    expect_fail(dir, STATUS_FORMAT, "tensor model.norm.weight", "not a string");
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"model.norm.weight\":\"model.safetensors\","
               "\"model.norm.weight\":\"model.safetensors\"}}");
    expect_fail(dir, STATUS_FORMAT, "tensor model.norm.weight is named twice", NULL);
}

static void test_bad_shard_content(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "bad_shard", dir, sizeof dir);
    write_bytes(dir, "model.safetensors", "\x02\0\0\0\0\0\0\0[]", 10);
    expect_fail(dir, STATUS_FORMAT, "model.safetensors", "not a JSON object");
}

static void test_empty_dir(void **state)
{
    struct fixture *fx = *state;
    char dir[4200];
    make_dir(fx, "empty", dir, sizeof dir);
    write_text(dir, "config.json", "{}");
    char want[4400];
    fmt(want, sizeof want, "%s: no model.safetensors or model.safetensors.index.json", dir);
    expect_fail(dir, STATUS_NOT_FOUND, want, NULL);

    fmt(want, sizeof want, "%s/does_not_exist", fx->root);
    expect_fail(want, STATUS_IO, "does_not_exist", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_file),
        cmocka_unit_test(test_sharded_index),
        cmocka_unit_test(test_scan_dir),
        cmocka_unit_test(test_index_missing_shard),
        cmocka_unit_test(test_index_tensor_not_in_shard),
        cmocka_unit_test(test_index_wrong_shard),
        cmocka_unit_test(test_tensor_in_two_shards),
        cmocka_unit_test(test_index_path_traversal),
        cmocka_unit_test(test_index_malformed),
        cmocka_unit_test(test_bad_shard_content),
        cmocka_unit_test(test_empty_dir),
    };
    return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}
