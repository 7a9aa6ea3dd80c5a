/* tok_normalize.c — HF normalizers: NFC/NFD/NFKC/NFKD, Lowercase, Replace,
 * Prepend, Strip, ByteLevel and Sequence (flattened into one list of steps).
 *
 * Each step rewrites the whole segment (HF normalizes each span between
 * non-normalized added tokens separately). Offsets are not tracked: only the
 * text matters for ids.
 * Not done: BertNormalizer, Precompiled (SentencePiece charsmap), NMT,
 * StripAccents — refused at load as unsupported.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/unicode.h"
#include "format/tok_internal.h"

static enum status tok_norm_add(struct tok_normalizer *nz, struct tok_norm *step, struct err *err)
{
    struct tok_norm *v = realloc(nz->steps, (nz->n + 1) * sizeof *v);
    if (!v) {
        free(step->pattern);
        free(step->content);
        regex_free(step->re);
        return err_set(err, STATUS_NOMEM, "out of memory loading the normalizer");
    }
    nz->steps = v;
    nz->steps[nz->n++] = *step;
    return STATUS_OK;
}

static enum status norm_parse_any(void *ctx, const struct json *j, const char *path, struct err *err)
{
    return tok_normalizer_parse(ctx, j, path, err);
}

enum status tok_normalizer_parse(struct tok_normalizer *nz, const struct json *j, const char *path,
                                 struct err *err)
{
    if (json_is_null(j))
        return STATUS_OK;
    if (!json_is_object(j))
        return err_set(err, STATUS_FORMAT, "%s: expected an object", path);
    const char *type;
    enum status st = tok_json_str(j, "type", path, true, &type, err);
    if (st)
        return st;
    struct tok_norm step = {0};
    if (!strcmp(type, "Sequence")) {
        return tok_sequence_parse(nz, j, "normalizers", path, norm_parse_any, err);
    } else if (!strcmp(type, "NFC")) {
        step.kind = TOK_NORM_NFC;
    } else if (!strcmp(type, "NFD")) {
        step.kind = TOK_NORM_NFD;
    } else if (!strcmp(type, "NFKC")) {
        step.kind = TOK_NORM_NFKC;
    } else if (!strcmp(type, "NFKD")) {
        step.kind = TOK_NORM_NFKD;
    } else if (!strcmp(type, "ByteLevel")) {
        step.kind = TOK_NORM_BYTELEVEL;
    } else if (!strcmp(type, "Lowercase")) {
        step.kind = TOK_NORM_LOWERCASE;
    } else if (!strcmp(type, "Replace")) {
        step.kind = TOK_NORM_REPLACE;
        if ((st = tok_replace_parse(j, path, &step.pattern, &step.pattern_len, &step.re, &step.content,
                                    &step.content_len, err)))
            return st;
    } else if (!strcmp(type, "Prepend")) {
        step.kind = TOK_NORM_PREPEND;
        const char *prepend;
        if ((st = tok_json_str(j, "prepend", path, true, &prepend, err)))
            return st;
        step.content_len = strlen(prepend);
        step.content = tok_strdup_n(prepend, step.content_len);
        if (!step.content)
            return err_set(err, STATUS_NOMEM, "out of memory loading the normalizer");
    } else if (!strcmp(type, "Strip")) {
        step.kind = TOK_NORM_STRIP;
        if ((st = tok_json_bool(j, "strip_left", path, true, &step.left, err)) ||
            (st = tok_json_bool(j, "strip_right", path, true, &step.right, err)))
            return st;
    } else {
        return err_set(err, STATUS_UNSUPPORTED, "%s.type: normalizer \"%s\" is not supported", path, type);
    }
    return tok_norm_add(nz, &step, err);
}

void tok_normalizer_free(struct tok_normalizer *nz)
{
    for (size_t i = 0; i < nz->n; i++) {
        free(nz->steps[i].pattern);
        free(nz->steps[i].content);
        regex_free(nz->steps[i].re);
    }
    free(nz->steps);
    memset(nz, 0, sizeof *nz);
}

/* True when `form` cannot change s: every char is below the first code point
 * the form can touch (U+0300 for NFC, U+00A0 for the others). */
static bool tok_norm_is_identity(enum unicode_form form, const char *s, size_t len)
{
    unsigned char limit = form == UNICODE_NFC ? 0xCC : 0xC2; /* lead bytes of U+0300 / U+00A0..U+00BF */
    if (form == UNICODE_NFD)
        limit = 0xC3; /* U+00C0 is the first char with a canonical decomposition */
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= limit)
            return form == UNICODE_NFC && unicode_is_nfc_quick(s + i, len - i);
    return true;
}

static enum status tok_norm_step(const struct tok_norm *st, struct tok_scratch *sc, const char *s, size_t len,
                                 struct tok_buf *out, bool *changed, struct err *err)
{
    *changed = true;
    out->n = 0;
    enum status rc;
    switch (st->kind) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD: {
        enum unicode_form form = st->kind == TOK_NORM_NFC    ? UNICODE_NFC
                                 : st->kind == TOK_NORM_NFD  ? UNICODE_NFD
                                 : st->kind == TOK_NORM_NFKC ? UNICODE_NFKC
                                                             : UNICODE_NFKD;
        if (tok_norm_is_identity(form, s, len)) {
            *changed = false;
            return STATUS_OK;
        }
        char *p;
        size_t n;
        if ((rc = unicode_normalize(form, s, len, &p, &n, err)))
            return rc;
        bool ok = tok_buf_put(out, p, n);
        free(p);
        return ok ? STATUS_OK : err_set(err, STATUS_NOMEM, "normalizer: out of memory");
    }
    case TOK_NORM_LOWERCASE:
        if (!tok_buf_reserve(out, len * 2 + 8))
            return err_set(err, STATUS_NOMEM, "normalizer: out of memory");
        for (size_t i = 0; i < len;) {
            uint32_t cp, low[3];
            i += unicode_utf8_decode(s + i, len - i, &cp);
            size_t k = unicode_to_lower(cp, low);
            for (size_t q = 0; q < k; q++) {
                char u[4];
                if (!tok_buf_put(out, u, unicode_utf8_encode(low[q], u)))
                    return err_set(err, STATUS_NOMEM, "normalizer: out of memory");
            }
        }
        return STATUS_OK;
    case TOK_NORM_REPLACE: {
        if ((rc = tok_find_all(st->re, st->pattern, st->pattern_len, &sc->rx, s, len, &sc->found, err)))
            return rc;
        if (!sc->found.n) {
            *changed = false;
            return STATUS_OK;
        }
        size_t last = 0;
        for (size_t m = 0; m < sc->found.n; m++) {
            const struct tok_match *mt = &sc->found.v[m];
            if (!tok_buf_put(out, s + last, mt->start - last) ||
                !tok_buf_put(out, st->content, st->content_len))
                return err_set(err, STATUS_NOMEM, "normalizer: out of memory");
            last = mt->end;
        }
        if (!tok_buf_put(out, s + last, len - last))
            return err_set(err, STATUS_NOMEM, "normalizer: out of memory");
        return STATUS_OK;
    }
    case TOK_NORM_BYTELEVEL: /* each byte becomes its GPT-2 ByteLevel char */
        if (!tok_buf_reserve(out, len * 2))
            return err_set(err, STATUS_NOMEM, "normalizer: out of memory");
        for (size_t i = 0; i < len; i++)
            out->n += unicode_utf8_encode(tok_bytelevel_char((unsigned char)s[i]), out->p + out->n);
        out->p[out->n] = 0;
        return STATUS_OK;
    case TOK_NORM_PREPEND:
        if (len == 0) {
            *changed = false;
            return STATUS_OK;
        }
        if (!tok_buf_put(out, st->content, st->content_len) || !tok_buf_put(out, s, len))
            return err_set(err, STATUS_NOMEM, "normalizer: out of memory");
        return STATUS_OK;
    case TOK_NORM_STRIP: {
        size_t a = 0, b = len;
        while (st->left && a < b) {
            uint32_t cp;
            size_t k = unicode_utf8_decode(s + a, b - a, &cp);
            if (!unicode_is_whitespace(cp))
                break;
            a += k;
        }
        while (st->right && b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80)
                p--;
            uint32_t cp;
            unicode_utf8_decode(s + p, b - p, &cp);
            if (!unicode_is_whitespace(cp))
                break;
            b = p;
        }
        if (!tok_buf_put(out, s + a, b - a))
            return err_set(err, STATUS_NOMEM, "normalizer: out of memory");
        return STATUS_OK;
    }
    }
    PANIC("unknown normalizer kind %d", (int)st->kind);
}

enum status tok_normalizer_apply(const struct tok_normalizer *nz, struct tok_scratch *sc, const char *s,
                                 size_t len, const char **out, size_t *out_len, struct err *err)
{
    const char *cur = s;
    size_t cur_len = len;
    int which = 0;
    for (size_t i = 0; i < nz->n; i++) {
        struct tok_buf *dst = &sc->norm[which];
        bool changed;
        enum status st = tok_norm_step(&nz->steps[i], sc, cur, cur_len, dst, &changed, err);
        if (st)
            return st;
        if (changed) {
            if (!tok_buf_reserve(dst, 0))
                return err_set(err, STATUS_NOMEM, "normalizer: out of memory");
            cur = dst->p ? dst->p : "";
            cur_len = dst->n;
            which ^= 1;
        }
    }
    *out = cur;
    *out_len = cur_len;
    return STATUS_OK;
}
