/* test_quant.c — quantized weights: codecs, round trip, bad input, quantizer.
 *
 * - E4M3 / E2M1 encoders against a brute-force nearest-value search (ties to
 *   the even code) over many values, including every boundary.
 * - Round trip: our quantizer's files (tests/golden/quant, written by
 *   `moeserve quantize`) dequantized by weight_dequant_row() must equal, bit
 *   for bit, what independent PyTorch code made of the same files
 *   (dequant_sha256.json from tools/make_quant_fixtures.py).
 * - Bad input: a scale of the wrong shape, a U8 weight without scales,
 *   in-features not a multiple of 16, NaN/Inf/negative scales, a config that
 *   contradicts the tensors: a clear error naming the tensor.
 * - The quantizer refuses what it cannot do (already quantized, K % 16).
 * - Byte accounting: weight_data_bytes / weight_scale_bytes / weight_bytes per format.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/weight.h"
#include "base/dtype.h"
#include "base/json.h"
#include "base/log.h"
#include "base/sha256.h"
#include "engine/model_session.h"
#include "engine/quantize.h"
#include "format/checkpoint.h"
#include "format/quant_codec.h"

static const char *src_dir(void)
{
    const char *s = getenv("MOESERVE_SRC");
    return s ? s : ".";
}

/* All scratch directories live under one root, removed by the group teardown. */
static char g_root[1024];

static void tmp_dir(char *out, size_t n, const char *tag)
{
    snprintf(out, n, "%s/%s_XXXXXX", g_root, tag);
    assert_non_null(mkdtemp(out));
}

static int root_setup(void **state)
{
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(g_root, sizeof g_root, "%s/test_quant_XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(g_root) ? 0 : -1;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int root_teardown(void **state)
{
    (void)state;
    return nftw(g_root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- codecs ---------------------------------------------------------------- */

static uint8_t e4m3_nearest(float x)
{
    /* brute force over the 127 finite non-negative codes; ties to the even code */
    float a = fabsf(x);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        float dc = fabsf(e4m3_to_f32((uint8_t)c) - a), db = fabsf(e4m3_to_f32((uint8_t)best) - a);
        if (dc < db || (dc == db && (c & 1) == 0 && (best & 1)))
            best = c;
    }
    if (a > 448.0f)
        best = 0x7e;
    return (uint8_t)((signbit(x) ? 0x80 : 0) | best);
}

static uint8_t e2m1_nearest(float x)
{
    float a = fabsf(x);
    int best = 0;
    for (int c = 1; c < 8; c++) {
        float dc = fabsf(e2m1_to_f32((uint8_t)c) - a), db = fabsf(e2m1_to_f32((uint8_t)best) - a);
        if (dc < db || (dc == db && (c & 1) == 0 && (best & 1)))
            best = c;
    }
    return (uint8_t)((signbit(x) && best ? 8 : 0) | best);
}

static void test_codecs_round_to_nearest_even(void **state)
{
    (void)state;
    uint64_t r = 42;
    for (int i = 0; i < 200000; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)(r >> 40) / 16777216.0f;
        float x = ldexpf(u, (int)((r >> 20) % 24) - 14) * ((r >> 10) & 1 ? -1.0f : 1.0f);
        uint8_t got = f32_to_e4m3(x), want = e4m3_nearest(x);
        if (got != want && !(x == 0 || (got & 0x7f) == 0))
            fail_msg("e4m3(%a) = 0x%02x, nearest-even 0x%02x", (double)x, got, want);
        float y = x * 0.01f;
        if (f32_to_e2m1(y) != e2m1_nearest(y))
            fail_msg("e2m1(%a) = %d, nearest-even %d", (double)y, f32_to_e2m1(y), e2m1_nearest(y));
    }
    /* every midpoint between neighbouring codes (the ties) */
    for (int c = 0; c < 0x7e; c++) {
        float mid = 0.5f * (e4m3_to_f32((uint8_t)c) + e4m3_to_f32((uint8_t)(c + 1)));
        assert_int_equal(f32_to_e4m3(mid), e4m3_nearest(mid));
    }
    const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++)
        assert_int_equal(f32_to_e2m1(ties[i]), e2m1_nearest(ties[i]));
    assert_int_equal(f32_to_e4m3(1e9f), 0x7e);
    assert_int_equal(f32_to_e2m1(100.0f), 7);
}

static void test_nvfp4_row_roundtrip_error(void **state)
{
    (void)state;
    /* quantize -> dequantize stays within half an E2M1 step of each block's scale */
    float w[64], back[64];
    uint8_t codes[32], scales[4];
    for (int i = 0; i < 64; i++)
        w[i] = sinf((float)i * 0.7f) * (1.0f + (float)(i / 16));
    float amax = 0;
    for (int i = 0; i < 64; i++)
        amax = fmaxf(amax, fabsf(w[i]));
    float s2 = nvfp4_global_scale(amax);
    nvfp4_quantize_row(w, 64, s2, codes, scales);
    struct weight wt = {.format = WEIGHT_NVFP4, .rows = 1, .cols = 64, .data = codes, .scale = scales, .scale2 = s2};
    weight_dequant_row(&wt, 0, back);
    for (int i = 0; i < 64; i++) {
        float step = e4m3_to_f32(scales[i / 16]) * s2; /* one unit of e2m1 */
        assert_true(fabsf(back[i] - w[i]) <= step * 1.0f + 1e-6f);
    }
}

/* ---- round trip against PyTorch ---------------------------------------------- */

static void sha_of_weight(const struct weight *w, char hex[65])
{
    float *row = malloc((size_t)w->cols * sizeof(float));
    struct sha256 s;
    sha256_init(&s);
    for (int64_t r = 0; r < w->rows; r++) {
        weight_dequant_row(w, r, row);
        sha256_update(&s, row, (size_t)w->cols * sizeof(float)); /* x86: little-endian, as Python wrote */
    }
    sha256_final_hex(&s, hex);
    free(row);
}

static int roundtrip_dir(const char *dir)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/dequant_sha256.json", dir);
    struct json *j = NULL;
    struct err err = {0};
    if (json_parse_file(path, &j, &err) != STATUS_OK)
        return 0; /* compressed-tensors copy: scale inversion rounds differently, parity only */
    struct checkpoint ck;
    assert_int_equal(checkpoint_open(&ck, dir, &err), STATUS_OK);
    int n = 0;
    for (const struct json *m = json_child(j); m; m = json_next(m)) {
        const char *name = json_key(m); /* "<module>.weight" */
        const struct st_tensor *t = checkpoint_find(&ck, name);
        assert_non_null(t);
        char module[600], sn[700];
        snprintf(module, sizeof module, "%.*s", (int)(strlen(name) - 7), name);
        struct weight w = {.rows = t->shape[0], .data = t->data, .scale2 = 1.0f};
        if (t->dtype == DTYPE_U8) {
            w.format = WEIGHT_NVFP4;
            w.cols = t->shape[1] * 2;
            snprintf(sn, sizeof sn, "%s.weight_scale", module);
            w.scale = checkpoint_find(&ck, sn)->data;
            snprintf(sn, sizeof sn, "%s.weight_scale_2", module);
            memcpy(&w.scale2, checkpoint_find(&ck, sn)->data, 4);
        } else {
            w.format = WEIGHT_FP8_BLOCK;
            w.cols = t->shape[1];
            snprintf(sn, sizeof sn, "%s.weight_scale_inv", module);
            w.scale = checkpoint_find(&ck, sn)->data;
        }
        char hex[65];
        sha_of_weight(&w, hex);
        if (strcmp(hex, json_string(m)) != 0)
            fail_msg("%s: %s dequantizes differently from PyTorch", dir, name);
        n++;
    }
    checkpoint_close(&ck);
    json_free(j);
    return n;
}

static void test_roundtrip_matches_pytorch(void **state)
{
    (void)state;
    char root[1024];
    snprintf(root, sizeof root, "%s/tests/golden/quant", src_dir());
    DIR *dp = opendir(root);
    assert_non_null(dp);
    struct dirent *de;
    int total = 0;
    while ((de = readdir(dp))) {
        if (de->d_name[0] == '.')
            continue;
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
        int n = roundtrip_dir(dir);
        print_message("  %-32s %d weights bit-identical to PyTorch\n", de->d_name, n);
        total += n;
    }
    closedir(dp);
    assert_true(total > 300);
}

/* ---- bad input ---------------------------------------------------------------- */

/* Output tensor for the safetensors writer below. */
struct wt {
    const char *name;
    const char *dtype;
    int n_dims;
    int64_t shape[2];
    const void *data;
    size_t n_bytes;
};

static void write_st(const char *path, const struct wt *ts, size_t n)
{
    char *hdr = malloc(1 << 20);
    size_t hl = (size_t)sprintf(hdr, "{");
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        hl += (size_t)sprintf(hdr + hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", ts[i].name, ts[i].dtype);
        for (int d = 0; d < ts[i].n_dims; d++)
            hl += (size_t)sprintf(hdr + hl, "%s%lld", d ? "," : "", (long long)ts[i].shape[d]);
        hl += (size_t)sprintf(hdr + hl, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                              (unsigned long long)(off + ts[i].n_bytes));
        off += ts[i].n_bytes;
    }
    hl += (size_t)sprintf(hdr + hl, "}");
    while (hl % 8)
        hdr[hl++] = ' ';
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    uint64_t h = hl;
    fwrite(&h, 8, 1, fp);
    fwrite(hdr, 1, hl, fp);
    for (size_t i = 0; i < n; i++)
        fwrite(ts[i].data, 1, ts[i].n_bytes, fp);
    fclose(fp);
    free(hdr);
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    assert_non_null(a);
    assert_non_null(b);
    char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, a)) > 0)
        fwrite(buf, 1, k, b);
    fclose(a);
    fclose(b);
}

enum mutation { MUT_SCALE_SHAPE, MUT_DROP_SCALE, MUT_NAN_SCALE, MUT_INF_SCALE2, MUT_NEG_SCALE, MUT_FP8_NAN };

/* Rewrites a quantized fixture with one tensor spoilt; returns the load error message. */
static void load_mutated(const char *fixture, enum mutation mut, const char *target, char *msg, size_t msg_n)
{
    char src[1024], dir[1024], path[2048], from[2048];
    snprintf(src, sizeof src, "%s/tests/golden/quant/%s", src_dir(), fixture);
    tmp_dir(dir, sizeof dir, "mut");
    snprintf(from, sizeof from, "%s/config.json", src);
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(from, path);
    snprintf(from, sizeof from, "%s/hf_quant_config.json", src);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    if (access(from, R_OK) == 0)
        copy_file(from, path);
    struct checkpoint ck;
    struct err err = {0};
    assert_int_equal(checkpoint_open(&ck, src, &err), STATUS_OK);
    size_t n = checkpoint_count(&ck);
    struct wt *ts = calloc(n, sizeof *ts);
    void **owned = calloc(n, sizeof *owned);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = checkpoint_tensor_at(&ck, i);
        struct wt w = {.name = t->name, .dtype = dtype_name(t->dtype), .n_dims = t->n_dims, .data = t->data,
                       .n_bytes = t->n_bytes};
        w.shape[0] = t->shape[0];
        w.shape[1] = t->shape[1];
        bool hit = strcmp(t->name, target) == 0;
        if (hit && mut == MUT_DROP_SCALE)
            continue;
        if (hit && mut == MUT_SCALE_SHAPE) {
            w.shape[1] -= 1;
            w.n_bytes = (size_t)(w.shape[0] * w.shape[1]);
        }
        if (hit && (mut == MUT_NAN_SCALE || mut == MUT_NEG_SCALE || mut == MUT_INF_SCALE2 || mut == MUT_FP8_NAN)) {
            unsigned char *c = malloc(t->n_bytes);
            memcpy(c, t->data, t->n_bytes);
            if (mut == MUT_NAN_SCALE)
                c[t->n_bytes / 2] = 0x7f;
            else if (mut == MUT_NEG_SCALE)
                c[0] = 0xb8; /* -1.0 */
            else {
                float bad = mut == MUT_INF_SCALE2 ? INFINITY : NAN;
                memcpy(c, &bad, 4);
            }
            w.data = owned[i] = c;
        }
        ts[k++] = w;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, ts, k);
    for (size_t i = 0; i < n; i++)
        free(owned[i]);
    free(owned);
    free(ts);
    checkpoint_close(&ck);
    struct model_session s;
    enum status st = model_session_open(&s, dir, NULL, &err);
    assert_int_not_equal(st, STATUS_OK);
    snprintf(msg, msg_n, "%s", err.msg);
}

static void expect_msg(const char *msg, const char *want)
{
    if (!strstr(msg, want))
        fail_msg("error \"%s\" lacks \"%s\"", msg, want);
}

static void test_bad_quantized_tensors(void **state)
{
    (void)state;
    char msg[ERR_MSG_MAX];
    const char *nv = "qwen3_basic_nvfp4", *t = "model.layers.0.self_attn.q_proj";
    char name[256];
    snprintf(name, sizeof name, "%s.weight_scale", t);
    load_mutated(nv, MUT_SCALE_SHAPE, name, msg, sizeof msg);
    expect_msg(msg, name);
    expect_msg(msg, "expected [128, 4]");
    load_mutated(nv, MUT_DROP_SCALE, name, msg, sizeof msg);
    expect_msg(msg, "has no F8_E4M3 weight_scale");
    expect_msg(msg, t);
    load_mutated(nv, MUT_NAN_SCALE, name, msg, sizeof msg);
    expect_msg(msg, "NaN");
    expect_msg(msg, name);
    load_mutated(nv, MUT_NEG_SCALE, name, msg, sizeof msg);
    expect_msg(msg, "negative");
    snprintf(name, sizeof name, "%s.weight_scale_2", t);
    load_mutated(nv, MUT_INF_SCALE2, name, msg, sizeof msg);
    expect_msg(msg, "finite");
    expect_msg(msg, name);
    snprintf(name, sizeof name, "%s.weight_scale_inv", "model.layers.1.mlp.experts.0.up_proj");
    load_mutated("glm4_basic_fp8", MUT_FP8_NAN, name, msg, sizeof msg);
    expect_msg(msg, name);
    expect_msg(msg, "NaN");
}

static void test_nvfp4_needs_k_multiple_of_16(void **state)
{
    (void)state;
    /* qwen3_yarn_tied has hidden_size 40: an NVFP4 q_proj [80, 40] cannot exist */
    char src[1024], dir[1024], path[2048], from[2048];
    snprintf(src, sizeof src, "%s/tests/golden/models/qwen3_yarn_tied", src_dir());
    tmp_dir(dir, sizeof dir, "k16");
    snprintf(from, sizeof from, "%s/config.json", src);
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(from, path);
    struct checkpoint ck;
    struct err err = {0};
    assert_int_equal(checkpoint_open(&ck, src, &err), STATUS_OK);
    size_t n = checkpoint_count(&ck), k = 0;
    struct wt *ts = calloc(n + 2, sizeof *ts);
    static uint8_t codes[80 * 20], scales[80 * 3];
    float one = 1.0f;
    memset(scales, 0x38, sizeof scales);
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = checkpoint_tensor_at(&ck, i);
        if (!strcmp(t->name, "model.layers.0.self_attn.q_proj.weight")) {
            ts[k++] = (struct wt){"model.layers.0.self_attn.q_proj.weight", "U8", 2, {80, 20}, codes, sizeof codes};
            ts[k++] = (struct wt){"model.layers.0.self_attn.q_proj.weight_scale", "F8_E4M3", 2, {80, 3}, scales,
                                  sizeof scales};
            ts[k++] = (struct wt){"model.layers.0.self_attn.q_proj.weight_scale_2", "F32", 0, {0, 0}, &one, 4};
            continue;
        }
        ts[k++] = (struct wt){t->name, dtype_name(t->dtype), t->n_dims, {t->shape[0], t->shape[1]}, t->data,
                              t->n_bytes};
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, ts, k);
    free(ts);
    checkpoint_close(&ck);
    struct model_session s;
    assert_int_not_equal(model_session_open(&s, dir, NULL, &err), STATUS_OK);
    expect_msg(err.msg, "divisible by 16");
    expect_msg(err.msg, "model.layers.0.self_attn.q_proj.weight");
}

static void test_config_contradiction(void **state)
{
    (void)state;
    /* the config claims attention is excluded, the tensors say NVFP4 */
    char src[1024], dir[1024], path[2048], from[2048];
    snprintf(src, sizeof src, "%s/tests/golden/quant/qwen3_basic_nvfp4", src_dir());
    tmp_dir(dir, sizeof dir, "cfg");
    snprintf(from, sizeof from, "%s/model.safetensors", src);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    copy_file(from, path);
    snprintf(from, sizeof from, "%s/config.json", src);
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(from, path);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    FILE *fp = fopen(path, "w");
    fputs("{\"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16, "
          "\"exclude_modules\": [\"lm_head\", \"*embed_tokens*\", \"*.mlp.gate\", \"*self_attn*\"]}}",
          fp);
    fclose(fp);
    struct model_session s;
    struct err err = {0};
    assert_int_not_equal(model_session_open(&s, dir, NULL, &err), STATUS_OK);
    expect_msg(err.msg, "self_attn");
    expect_msg(err.msg, "hf_quant_config.json");
    expect_msg(err.msg, "unquantized");
}

/* The byte accounting the CUDA backend's prefetch ranges rely on: data and scales of every
 * format, as the formats define them, and together with the bias (and NVFP4's f32 global scale)
 * what weight_bytes() says a kernel reads. */
static void test_weight_byte_accounting(void **state)
{
    (void)state;
    const int64_t rows = 300, cols = 272; /* not multiples of 128: FP8's partial scale blocks */
    for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            struct weight w = {.format = (enum weight_format)f, .rows = rows, .cols = cols,
                               .bias = with_bias ? (const float *)&w : NULL};
            size_t n = (size_t)rows * (size_t)cols, data = 0, scale = 0, extra = 0;
            switch (w.format) {
            case WEIGHT_F32: data = 4 * n; break;
            case WEIGHT_BF16:
            case WEIGHT_F16: data = 2 * n; break;
            case WEIGHT_FP8_BLOCK: data = n, scale = (size_t)3 * 3 * 4; break; /* ceil(300/128) x ceil(272/128) f32 */
            case WEIGHT_NVFP4: data = n / 2, scale = n / 16, extra = 4; break; /* + the f32 scale2 */
            case WEIGHT_FORMAT_COUNT: break;
            }
            assert_int_equal(weight_data_bytes(&w), data);
            assert_int_equal(weight_scale_bytes(&w), scale);
            assert_int_equal(weight_bytes(&w), data + scale + extra + (with_bias ? (size_t)rows * 4 : 0));
        }
}

static void test_quantizer_refusals(void **state)
{
    (void)state;
    char out[1024], in[1024];
    struct err err = {0};
    tmp_dir(out, sizeof out, "qout");
    struct quantize_opts o = {.format = WEIGHT_NVFP4};
    snprintf(in, sizeof in, "%s/tests/golden/models/qwen3_yarn_tied", src_dir());
    assert_int_not_equal(quantize_checkpoint(in, out, &o, &err), STATUS_OK);
    expect_msg(err.msg, "not a multiple of 16");
    snprintf(in, sizeof in, "%s/tests/golden/quant/qwen3_basic_nvfp4", src_dir());
    assert_int_not_equal(quantize_checkpoint(in, out, &o, &err), STATUS_OK);
    expect_msg(err.msg, "already quantized");
    /* and a FP8 pass over K = 40 works, and loads */
    o.format = WEIGHT_FP8_BLOCK;
    snprintf(in, sizeof in, "%s/tests/golden/models/qwen3_yarn_tied", src_dir());
    assert_int_equal(quantize_checkpoint(in, out, &o, &err), STATUS_OK);
    struct model_session s;
    assert_int_equal(model_session_open(&s, out, NULL, &err), STATUS_OK);
    assert_true(s.w.bytes_by_format[WEIGHT_FP8_BLOCK] > 0);
    model_session_close(&s);
}

int main(void)
{
    log_set_level(LOG_LEVEL_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codecs_round_to_nearest_even), cmocka_unit_test(test_nvfp4_row_roundtrip_error),
        cmocka_unit_test(test_roundtrip_matches_pytorch),    cmocka_unit_test(test_bad_quantized_tensors),
        cmocka_unit_test(test_nvfp4_needs_k_multiple_of_16), cmocka_unit_test(test_config_contradiction),
        cmocka_unit_test(test_quantizer_refusals),           cmocka_unit_test(test_weight_byte_accounting),
    };
    return cmocka_run_group_tests(tests, root_setup, root_teardown);
}
