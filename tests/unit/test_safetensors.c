/* test_safetensors.c — the safetensors reader on real files in a temp dir.
 *
 * Valid files: every dtype we load, a 0-d scalar, an empty tensor and
 * metadata, with values read back. Bad files: one per validation rule; each
 * must fail cleanly with a message naming the file and (where there is one)
 * the tensor. Files are written by a tiny builder (header JSON + data) or raw.
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
#include <unistd.h>

#include "format/safetensors.h"

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
    char dir[4096]; /* mkdtemp'ed, removed at teardown */
};

static int fixture_setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof *fx);
    if (!fx)
        return -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(fx->dir, sizeof fx->dir, "%s/st_test_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fx->dir)) {
        free(fx);
        return -1;
    }
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
    nftw(fx->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(fx);
    return 0;
}

/* Writes raw bytes to dir/name; returns the path in out. */
static void write_raw(const char *dir, const char *name, const void *bytes, size_t len, char *out,
                      size_t out_size)
{
    fmt(out, out_size, "%s/%s", dir, name);
    FILE *fp = fopen(out, "wb");
    assert_non_null(fp);
    if (len)
        assert_int_equal(fwrite(bytes, 1, len, fp), len);
    assert_int_equal(fclose(fp), 0);
}

/* u64 LE header length + header + data_len bytes of data (0x5a). */
static void write_st(const char *dir, const char *name, const char *header, size_t data_len,
                     char *out, size_t out_size)
{
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + data_len + 1);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, 0x5a, data_len);
    write_raw(dir, name, buf, 8 + hl + data_len, out, out_size);
    free(buf);
}

/* Builds a valid file tensor by tensor. */
struct builder {
    char header[8192];
    size_t hlen;
    unsigned char data[4096];
    size_t dlen;
};

static void builder_add(struct builder *b, const char *name, const char *dtype, const char *shape,
                        const void *bytes, size_t n)
{
    assert_true(b->dlen + n <= sizeof b->data);
    int w = snprintf(b->header + b->hlen, sizeof b->header - b->hlen,
                     "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                     b->hlen ? "," : "{", name, dtype, shape, b->dlen, b->dlen + n);
    assert_true(w > 0 && (size_t)w < sizeof b->header - b->hlen);
    b->hlen += (size_t)w;
    if (n) /* memcpy(.., NULL, 0) is still undefined */
        memcpy(b->data + b->dlen, bytes, n);
    b->dlen += n;
}

static void builder_write(struct builder *b, const char *dir, const char *name, char *out,
                          size_t out_size)
{
    snprintf(b->header + b->hlen, sizeof b->header - b->hlen, "%s", b->hlen ? "}" : "{}");
    size_t hl = strlen(b->header);
    unsigned char *buf = malloc(8 + hl + b->dlen);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, b->header, hl);
    memcpy(buf + 8 + hl, b->data, b->dlen);
    write_raw(dir, name, buf, 8 + hl + b->dlen, out, out_size);
    free(buf);
}

static void test_valid_all_dtypes(void **state)
{
    struct fixture *fx = *state;
    struct builder *b = calloc(1, sizeof *b);
    assert_non_null(b);
    /* The builder writes the header in insertion order; use odd offsets too,
     * since safetensors does not promise alignment. */
    const uint16_t bf[2] = {0x3f80, 0xc000};                /* 1, -2 */
    const uint16_t hf[2] = {0x3c00, 0x3800};                /* 1, 0.5 */
    const float f32[4] = {1.0f, 2.0f, 3.0f, -4.5f};
    const uint8_t e4m3[3] = {0x38, 0x40, 0xb8};             /* 1, 2, -1 */
    const uint8_t u8[3] = {200, 7, 0};
    const int8_t i8[2] = {-5, 100};
    const int32_t i32 = -123456;                            /* 0-d scalar */
    const int64_t i64[2] = {(int64_t)1 << 40, -1};
    builder_add(b, "u8", "U8", "[3]", u8, sizeof u8); /* 3 bytes: makes the rest unaligned */
    builder_add(b, "bf", "BF16", "[2]", bf, sizeof bf);
    builder_add(b, "hf", "F16", "[1,2]", hf, sizeof hf);
    builder_add(b, "f32", "F32", "[2,2]", f32, sizeof f32);
    builder_add(b, "e4m3", "F8_E4M3", "[3]", e4m3, sizeof e4m3);
    builder_add(b, "i8", "I8", "[2]", i8, sizeof i8);
    builder_add(b, "scalar", "I32", "[]", &i32, sizeof i32);
    builder_add(b, "i64", "I64", "[2,1]", i64, sizeof i64);
    builder_add(b, "empty", "F32", "[0,3]", NULL, 0);
    /* __metadata__ may appear anywhere in the header. */
    const char *meta = ",\"__metadata__\":{\"format\":\"pt\"}";
    memcpy(b->header + b->hlen, meta, strlen(meta) + 1);
    b->hlen += strlen(meta);
    char path[4200];
    builder_write(b, fx->dir, "model.safetensors", path, sizeof path);
    free(b);

    struct st_file f = {0};
    struct err err = {0};
    assert_int_equal(st_file_open(&f, path, &err), STATUS_OK);
    assert_int_equal(f.n_tensors, 9);
    assert_non_null(f.metadata);
    assert_string_equal(json_string(json_get(f.metadata, "format")), "pt");

    /* Header order is kept. */
    assert_string_equal(f.tensors[0].name, "u8");
    assert_string_equal(f.tensors[8].name, "empty");

    const struct st_tensor *t = st_file_find(&f, "bf");
    assert_non_null(t);
    assert_int_equal(t->dtype, DTYPE_BF16);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->n_bytes, 4);
    assert_string_equal(t->file, path);
    uint16_t h[2];
    memcpy(h, t->data, sizeof h); /* data may be unaligned */
    assert_true(bf16_to_f32(h[0]) == 1.0f && bf16_to_f32(h[1]) == -2.0f);

    t = st_file_find(&f, "hf");
    assert_non_null(t);
    assert_int_equal(t->dtype, DTYPE_F16);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(st_tensor_numel(t), 2);
    memcpy(h, t->data, sizeof h);
    assert_true(f16_to_f32(h[0]) == 1.0f && f16_to_f32(h[1]) == 0.5f);

    t = st_file_find(&f, "f32");
    assert_non_null(t);
    assert_int_equal(t->dtype, DTYPE_F32);
    assert_int_equal(st_tensor_numel(t), 4);
    float fv[4];
    memcpy(fv, t->data, sizeof fv);
    assert_memory_equal(fv, f32, sizeof fv);

    t = st_file_find(&f, "e4m3");
    assert_non_null(t);
    assert_int_equal(t->dtype, DTYPE_F8_E4M3);
    const uint8_t *e = t->data;
    assert_true(e4m3_to_f32(e[0]) == 1.0f && e4m3_to_f32(e[1]) == 2.0f &&
                e4m3_to_f32(e[2]) == -1.0f);

    t = st_file_find(&f, "u8");
    assert_non_null(t);
    assert_int_equal(t->dtype, DTYPE_U8);
    assert_memory_equal(t->data, u8, sizeof u8);

    t = st_file_find(&f, "i8");
    assert_non_null(t);
    assert_int_equal(t->dtype, DTYPE_I8);
    assert_memory_equal(t->data, i8, sizeof i8);

    t = st_file_find(&f, "scalar");
    assert_non_null(t);
    assert_int_equal(t->dtype, DTYPE_I32);
    assert_int_equal(t->n_dims, 0);
    assert_int_equal(st_tensor_numel(t), 1);
    int32_t iv;
    memcpy(&iv, t->data, sizeof iv);
    assert_int_equal(iv, -123456);

    t = st_file_find(&f, "i64");
    assert_non_null(t);
    assert_int_equal(t->dtype, DTYPE_I64);
    int64_t lv[2];
    memcpy(lv, t->data, sizeof lv);
    assert_true(lv[0] == ((int64_t)1 << 40) && lv[1] == -1);

    t = st_file_find(&f, "empty");
    assert_non_null(t);
    assert_int_equal(t->n_bytes, 0);
    assert_int_equal(st_tensor_numel(t), 0);

    assert_null(st_file_find(&f, "nope"));
    st_file_close(&f);
    assert_null(f.tensors);
    st_file_close(&f); /* idempotent on a zeroed struct */
}

static void test_empty_header_object(void **state)
{
    struct fixture *fx = *state;
    char path[4200];
    write_st(fx->dir, "none.safetensors", "{}", 0, path, sizeof path);
    struct st_file f = {0};
    struct err err = {0};
    assert_int_equal(st_file_open(&f, path, &err), STATUS_OK);
    assert_int_equal(f.n_tensors, 0);
    assert_null(f.metadata);
    st_file_close(&f);

    /* Trailing spaces pad headers to 8 bytes in files written by the reference. */
    write_st(fx->dir, "pad.safetensors",
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}     ", 2, path,
             sizeof path);
    assert_int_equal(st_file_open(&f, path, &err), STATUS_OK);
    assert_int_equal(f.n_tensors, 1);
    st_file_close(&f);

    /* Brackets and escaped quotes inside strings are not structure. */
    write_st(fx->dir, "brackets.safetensors", "{\"__metadata__\":{\"k\":\"}]\\\"{\"}}\n", 0,
             path, sizeof path);
    assert_int_equal(st_file_open(&f, path, &err), STATUS_OK);
    assert_string_equal(json_string(json_get(f.metadata, "k")), "}]\"{");
    st_file_close(&f);
}

static void test_parse_buffer(void **state)
{
    const char *hdr = "{\"w\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
    const int16_t vals[2] = {1, -2};
    size_t hl = strlen(hdr);
    unsigned char img[256];
    for (int i = 0; i < 8; i++)
        img[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(img + 8, hdr, hl);
    memcpy(img + 8 + hl, vals, sizeof vals);
    struct st_file f = {0};
    struct err err = {0};
    assert_int_equal(st_parse_buffer(&f, img, 8 + hl + sizeof vals, "mem", &err), STATUS_OK);
    assert_int_equal(f.n_tensors, 1);
    assert_ptr_equal(f.tensors[0].data, img + 8 + hl);
    assert_string_equal(f.tensors[0].file, "mem");
    st_file_close(&f);

    /* One byte short: the tensor no longer fits. */
    assert_int_equal(st_parse_buffer(&f, img, 8 + hl + sizeof vals - 1, "mem", &err),
                     STATUS_FORMAT);
    assert_non_null(strstr(err.msg, "mem: tensor w: data_offsets [0,4] out of range"));
    assert_null(f.tensors);
}

/* Opens path and checks the failure: status, and substrings of the message. */
static void expect_fail(const char *path, enum status code, const char *want1, const char *want2)
{
    struct st_file f = {0};
    struct err err = {0};
    enum status st = st_file_open(&f, path, &err);
    if (st != code || !strstr(err.msg, path) || (want1 && !strstr(err.msg, want1)) ||
        (want2 && !strstr(err.msg, want2)))
        fail_msg("%s: got status %d (want %d), message \"%s\" (want \"%s\", \"%s\")", path, st,
                 code, err.msg, want1 ? want1 : "", want2 ? want2 : "");
    assert_null(f.tensors);
    assert_null(f.map.data);
    st_file_close(&f);
}

static void test_truncated_prefix(void **state)
{
    struct fixture *fx = *state;
    char path[4200];
    write_raw(fx->dir, "short.safetensors", "\x05\0\0\0\0", 5, path, sizeof path);
    expect_fail(path, STATUS_FORMAT, "too short", NULL);
    write_raw(fx->dir, "zero.safetensors", "", 0, path, sizeof path);
    expect_fail(path, STATUS_FORMAT, "too short", NULL);
}

static void test_header_past_eof(void **state)
{
    struct fixture *fx = *state;
    char path[4200];
    /* Claims 100 header bytes, has 2. */
    write_raw(fx->dir, "hdr_eof.safetensors", "\x64\0\0\0\0\0\0\0{}", 10, path, sizeof path);
    expect_fail(path, STATUS_FORMAT, "header length 100", "past the end");
    /* Header length just past the cap. */
    write_raw(fx->dir, "hdr_cap.safetensors", "\x01\xe1\xf5\x05\0\0\0\0{}", 10, path,
              sizeof path);
    expect_fail(path, STATUS_FORMAT, "exceeds", NULL);
}

static void test_header_huge(void **state)
{
    struct fixture *fx = *state;
    char path[4200];
    write_raw(fx->dir, "hdr_huge.safetensors", "\0\0\0\0\0\0\0\x80{}", 10, path, sizeof path);
    expect_fail(path, STATUS_FORMAT, "9223372036854775808", "exceeds");
    write_raw(fx->dir, "hdr_max.safetensors", "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10, path,
              sizeof path);
    expect_fail(path, STATUS_FORMAT, "exceeds", NULL);
}

/* One bad header per validation rule. */
struct bad_case {
    const char *file;
    const char *header;
    size_t data_len;
    enum status code;
    const char *want1, *want2;
};

#define T(dt, shape, offs) "{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}"

static const struct bad_case BAD_CASES[] = {
    {"empty_header.safetensors", "", 0, STATUS_FORMAT, "malformed JSON", NULL},
    {"malformed.safetensors", "{\"a\": {\"dtype\":", 0, STATUS_FORMAT, "malformed JSON", NULL},
    {"garbage.safetensors", "\x01\xff\xfe", 0, STATUS_FORMAT, "malformed JSON", NULL},
    {"trailing.safetensors", "{}x", 0, STATUS_FORMAT, "trailing", NULL},
    {"trailing2.safetensors", "{\"a\":{\"b\":\"}\\\"}\"}} {}", 0, STATUS_FORMAT, "trailing", NULL},
    {"array.safetensors", "[1,2]", 0, STATUS_FORMAT, "not a JSON object", NULL},
    {"string.safetensors", "\"x\"", 0, STATUS_FORMAT, "not a JSON object", NULL},
    {"entry_num.safetensors", "{\"m.w\":5}", 0, STATUS_FORMAT, "tensor m.w", "not an object"},
    {"range.safetensors",
     "{\"model.layers.3.mlp.gate.weight\":" T("F32", "[4]", "[0,16]") "}", 8, STATUS_FORMAT,
     "tensor model.layers.3.mlp.gate.weight", "data_offsets [0,16] out of range"},
    {"data_short.safetensors", "{\"w\":" T("U8", "[10]", "[0,10]") "}", 9, STATUS_FORMAT,
     "tensor w", "out of range"},
    {"begin_end.safetensors",
     "{\"model.layers.3.mlp.gate.weight\":" T("U8", "[6]", "[10,4]") "}", 16, STATUS_FORMAT,
     "tensor model.layers.3.mlp.gate.weight", "data_offsets [10,4] out of range"},
    {"overlap.safetensors", "{\"a\":" T("F32", "[2]", "[0,8]") ",\"b\":" T("F32", "[2]", "[4,12]") "}",
     12, STATUS_FORMAT, "tensor b", "overlap tensor a"},
    {"overlap_inside.safetensors",
     "{\"big\":" T("U8", "[16]", "[0,16]") ",\"small\":" T("U8", "[2]", "[4,6]") "}", 16,
     STATUS_FORMAT, "overlap", "big"},
    {"same_range.safetensors",
     "{\"a\":" T("U8", "[4]", "[0,4]") ",\"b\":" T("U8", "[4]", "[0,4]") "}", 4, STATUS_FORMAT,
     "overlap", NULL},
    {"bytes.safetensors", "{\"w\":" T("F32", "[3]", "[0,8]") "}", 8, STATUS_FORMAT, "tensor w",
     "need 12 bytes"},
    {"bytes0.safetensors", "{\"w\":" T("F32", "[0]", "[0,4]") "}", 4, STATUS_FORMAT, "tensor w",
     "need 0 bytes"},
    {"neg_shape.safetensors", "{\"w\":" T("U8", "[-1]", "[0,0]") "}", 0, STATUS_FORMAT, "tensor w",
     "shape[0]"},
    {"float_shape.safetensors", "{\"w\":" T("U8", "[2,1.5]", "[0,3]") "}", 3, STATUS_FORMAT,
     "tensor w", "shape[1]"},
    {"big_shape.safetensors", "{\"w\":" T("U8", "[1e30]", "[0,0]") "}", 0, STATUS_FORMAT,
     "tensor w", "shape[0]"},
    {"str_shape.safetensors", "{\"w\":" T("U8", "[\"2\"]", "[0,2]") "}", 2, STATUS_FORMAT,
     "tensor w", "shape[0]"},
    {"obj_shape.safetensors", "{\"w\":" T("U8", "{}", "[0,0]") "}", 0, STATUS_FORMAT, "tensor w",
     "not an array"},
    {"dims9.safetensors", "{\"w\":" T("U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1, STATUS_FORMAT,
     "tensor w", "more than 8"},
    {"overflow.safetensors",
     "{\"w\":" T("U8", "[4294967296,4294967296,4294967296]", "[0,0]") "}", 0, STATUS_FORMAT,
     "tensor w", "overflows"},
    {"overflow_bytes.safetensors", "{\"w\":" T("I64", "[4294967296,2147483648]", "[0,0]") "}", 0,
     STATUS_FORMAT, "tensor w", "overflows"},
    {"dtype.safetensors", "{\"w\":" T("F4", "[2]", "[0,1]") "}", 1, STATUS_UNSUPPORTED, "tensor w",
     "unsupported dtype \"F4\""},
    {"dtype_case.safetensors", "{\"w\":" T("bf16", "[2]", "[0,4]") "}", 4, STATUS_UNSUPPORTED,
     "tensor w", "\"bf16\""},
    {"dtype_num.safetensors", "{\"w\":{\"dtype\":3,\"shape\":[],\"data_offsets\":[0,1]}}", 1,
     STATUS_FORMAT, "tensor w", "\"dtype\" is not a string"},
    {"no_dtype.safetensors", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, STATUS_FORMAT,
     "tensor w", "missing \"dtype\""},
    {"no_shape.safetensors", "{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, STATUS_FORMAT,
     "tensor w", "missing \"shape\""},
    {"no_offsets.safetensors", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, STATUS_FORMAT,
     "tensor w", "missing \"data_offsets\""},
    {"offs_arity.safetensors", "{\"w\":" T("U8", "[1]", "[0]") "}", 1, STATUS_FORMAT, "tensor w",
     "data_offsets"},
    {"offs_arity3.safetensors", "{\"w\":" T("U8", "[1]", "[0,1,2]") "}", 2, STATUS_FORMAT,
     "tensor w", "data_offsets"},
    {"offs_neg.safetensors", "{\"w\":" T("U8", "[1]", "[-1,0]") "}", 1, STATUS_FORMAT, "tensor w",
     "data_offsets"},
    {"offs_float.safetensors", "{\"w\":" T("U8", "[1]", "[0.5,1.5]") "}", 2, STATUS_FORMAT,
     "tensor w", "data_offsets"},
    {"offs_str.safetensors", "{\"w\":" T("U8", "[1]", "[\"0\",\"1\"]") "}", 1, STATUS_FORMAT,
     "tensor w", "data_offsets"},
    {"offs_huge.safetensors", "{\"w\":" T("U8", "[1]", "[0,1e300]") "}", 1, STATUS_FORMAT,
     "tensor w", "data_offsets"},
    {"dup.safetensors", "{\"w\":" T("U8", "[1]", "[0,1]") ",\"w\":" T("U8", "[1]", "[1,2]") "}", 2,
     STATUS_FORMAT, "tensor w", "duplicate"},
    {"meta_type.safetensors", "{\"__metadata__\":[1]}", 0, STATUS_FORMAT, "__metadata__", NULL},
    {"meta_val.safetensors", "{\"__metadata__\":{\"format\":1}}", 0, STATUS_FORMAT,
     "__metadata__", "format"},
    {"meta_dup.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, STATUS_FORMAT,
     "__metadata__", "twice"},
};

static void test_bad_headers(void **state)
{
    struct fixture *fx = *state;
    for (size_t i = 0; i < sizeof BAD_CASES / sizeof BAD_CASES[0]; i++) {
        const struct bad_case *c = &BAD_CASES[i];
        char path[4200];
        write_st(fx->dir, c->file, c->header, c->data_len, path, sizeof path);
        expect_fail(path, c->code, c->want1, c->want2);
    }
}

static void test_missing_file(void **state)
{
    struct fixture *fx = *state;
    char path[4200];
    fmt(path, sizeof path, "%s/absent.safetensors", fx->dir);
    expect_fail(path, STATUS_IO, NULL, NULL);
    expect_fail(fx->dir, STATUS_IO, "not a regular file", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_all_dtypes),
        cmocka_unit_test(test_empty_header_object),
        cmocka_unit_test(test_parse_buffer),
        cmocka_unit_test(test_truncated_prefix),
        cmocka_unit_test(test_header_past_eof),
        cmocka_unit_test(test_header_huge),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_missing_file),
    };
    return cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);
}
