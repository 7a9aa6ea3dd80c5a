/* regex.c — PCRE2 behind regex.h. The only file that includes pcre2.h.
 *
 * Patterns are compiled with PCRE2_UTF | PCRE2_UCP and JIT-compiled when the
 * platform has a JIT; matching uses PCRE2_NO_UTF_CHECK (callers validate).
 * The JIT first runs on its default 32 KiB machine-stack area; on
 * PCRE2_ERROR_JIT_STACKLIMIT the scratch gets a growable JIT stack (up to
 * 8 MiB) and the match is retried.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "base/regex.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct regex {
    pcre2_code *code;
    bool jit; /* JIT-compiled: match with pcre2_jit_match */
};

/* Unicode White_Space and Unicode word characters, as class bodies. */
static const char ONIG_SPACE[] =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"
    "\\x{205f}\\x{3000}";
static const char ONIG_WORD[] = "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200c}\\x{200d}\\x{24b6}-\\x{24e9}"
                                "\\x{1f130}-\\x{1f149}\\x{1f150}-\\x{1f169}\\x{1f170}-\\x{1f189}";

struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void sbuf_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sbuf_puts(struct sbuf *b, const char *s)
{
    sbuf_put(b, s, strlen(s));
}

/* Rewrites \s \S \w \W to Oniguruma's Unicode meaning (see regex.h). */
static bool regex_rewrite_onig(const char *p, size_t len, struct sbuf *out)
{
    bool in_class = false;
    size_t i = 0;
    while (i < len) {
        char c = p[i];
        if (c == '\\' && i + 1 < len) {
            char n = p[i + 1];
            if (n == 'Q') { /* quoted run: copy through \E verbatim */
                size_t j = i + 2;
                while (j + 1 < len && !(p[j] == '\\' && p[j + 1] == 'E'))
                    j++;
                j = j + 1 < len ? j + 2 : len;
                sbuf_put(out, p + i, j - i);
                i = j;
                continue;
            }
            const char *body = (n == 's' || n == 'S')   ? ONIG_SPACE
                               : (n == 'w' || n == 'W') ? ONIG_WORD
                                                        : NULL;
            if (body && in_class && (n == 's' || n == 'w')) {
                sbuf_puts(out, body);
            } else if (body && !in_class) {
                sbuf_puts(out, (n == 'S' || n == 'W') ? "[^" : "[");
                sbuf_puts(out, body);
                sbuf_puts(out, "]");
            } else {
                sbuf_put(out, p + i, 2);
            }
            i += 2;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            size_t j = i + 1;
            if (j < len && p[j] == '^')
                j++;
            if (j < len && p[j] == ']') /* a leading ] is literal */
                j++;
            sbuf_put(out, p + i, j - i);
            i = j;
            continue;
        }
        if (in_class && c == '[' && i + 1 < len && p[i + 1] == ':') { /* [:posix:] */
            const char *end = NULL;
            for (size_t j = i + 2; j + 1 < len; j++)
                if (p[j] == ':' && p[j + 1] == ']') {
                    end = p + j + 2;
                    break;
                }
            size_t j = end ? (size_t)(end - p) : i + 1;
            sbuf_put(out, p + i, j - i);
            i = j;
            continue;
        }
        if (in_class && c == ']')
            in_class = false;
        sbuf_put(out, p + i, 1);
        i++;
    }
    return !out->oom;
}

enum status regex_compile(struct regex **out, const char *pattern, size_t len, unsigned flags,
                          const char *what, struct err *err)
{
    *out = NULL;
    struct sbuf rw = {0};
    const char *pat = pattern;
    size_t plen = len;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    if (flags & REGEX_ONIG) {
        if (!regex_rewrite_onig(pattern, len, &rw)) {
            free(rw.p);
            return err_set(err, STATUS_NOMEM, "%s: out of memory compiling regex", what);
        }
        pat = rw.p ? rw.p : "";
        plen = rw.n;
        opts |= PCRE2_MULTILINE;
    }
    int ec = 0;
    PCRE2_SIZE eoff = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pat, plen, opts, &ec, &eoff, NULL);
    free(rw.p);
    if (!code) {
        PCRE2_UCHAR msg[256];
        if (pcre2_get_error_message(ec, msg, sizeof msg) < 0)
            snprintf((char *)msg, sizeof msg, "error %d", ec);
        return err_set(err, STATUS_FORMAT, "%s: regex \"%.*s\" does not compile: %s", what,
                       (int)(len > 300 ? 300 : len), pattern, (const char *)msg);
    }
    struct regex *re = calloc(1, sizeof *re);
    if (!re) {
        pcre2_code_free(code);
        return err_set(err, STATUS_NOMEM, "%s: out of memory compiling regex", what);
    }
    re->code = code;
    re->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    *out = re;
    return STATUS_OK;
}

void regex_free(struct regex *re)
{
    if (!re)
        return;
    pcre2_code_free(re->code);
    free(re);
}

void regex_scratch_free(struct regex_scratch *s)
{
    pcre2_match_data_free(s->match_data);
    pcre2_match_context_free(s->context);
    pcre2_jit_stack_free(s->jit_stack);
    memset(s, 0, sizeof *s);
}

enum status regex_find(const struct regex *re, struct regex_scratch *s, const char *subject, size_t len,
                       size_t start, bool *found, size_t *mstart, size_t *mend, struct err *err)
{
    *found = false;
    if (!s->match_data) {
        /* Enough pairs for any pattern we see; only pair 0 is read. */
        s->match_data = pcre2_match_data_create(16, NULL);
        if (!s->match_data)
            return err_set(err, STATUS_NOMEM, "regex: out of memory");
    }
    pcre2_match_data *md = s->match_data;
    int rc;
    if (re->jit) {
        rc = pcre2_jit_match(re->code, (PCRE2_SPTR)subject, len, start, PCRE2_NO_UTF_CHECK, md, s->context);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !s->jit_stack) {
            s->context = pcre2_match_context_create(NULL);
            s->jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, NULL);
            if (!s->context || !s->jit_stack)
                return err_set(err, STATUS_NOMEM, "regex: out of memory");
            pcre2_jit_stack_assign(s->context, NULL, s->jit_stack);
            rc = pcre2_jit_match(re->code, (PCRE2_SPTR)subject, len, start, PCRE2_NO_UTF_CHECK, md,
                                 s->context);
        }
    } else {
        rc = pcre2_match(re->code, (PCRE2_SPTR)subject, len, start, PCRE2_NO_UTF_CHECK, md, NULL);
    }
    if (rc == PCRE2_ERROR_NOMATCH)
        return STATUS_OK;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        if (pcre2_get_error_message(rc, msg, sizeof msg) < 0)
            snprintf((char *)msg, sizeof msg, "error %d", rc);
        return err_set(err, STATUS_UNSUPPORTED, "regex match failed at byte %zu: %s", start,
                       (const char *)msg);
    }
    /* rc == 0 means "ovector too small for all groups": pair 0 is still set. */
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *found = true;
    *mstart = ov[0];
    *mend = ov[1];
    return STATUS_OK;
}
