/* tok_decode.c — HF decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip,
 * Metaspace and Sequence (flattened), run on a list of token strings exactly
 * like Decoder::decode_chain followed by join("").
 *
 * ByteLevel maps each token's chars back to bytes (a token with any char
 * outside the byte alphabet is taken as its raw UTF-8), concatenates them and
 * applies from_utf8_lossy, yielding one token. ByteFallback turns runs of
 * "<0xXX>" tokens into their UTF-8 text, or one U+FFFD per byte when the run
 * is not valid UTF-8. Strip and Metaspace act on each token.
 * Not done: WordPiece, BPEDecoder, CTC decoders (refused at load).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/unicode.h"
#include "format/tok_internal.h"

static enum status dec_add(struct tok_decoder *d, struct tok_dec *step, struct err *err)
{
    struct tok_dec *v = realloc(d->steps, (d->n + 1) * sizeof *v);
    if (!v) {
        free(step->pattern);
        free(step->content);
        regex_free(step->re);
        return err_set(err, STATUS_NOMEM, "out of memory loading the decoder");
    }
    d->steps = v;
    d->steps[d->n++] = *step;
    return STATUS_OK;
}

static enum status dec_one_char(const struct json *j, const char *key, const char *path, uint32_t *out,
                                struct err *err)
{
    const char *s;
    enum status st = tok_json_str(j, key, path, true, &s, err);
    if (st)
        return st;
    size_t n = strlen(s);
    if (n == 0 || unicode_utf8_decode(s, n, out) != n)
        return err_set(err, STATUS_FORMAT, "%s.%s: expected exactly one character", path, key);
    return STATUS_OK;
}

static enum status dec_parse(struct tok_decoder *d, const struct json *j, const char *path, struct err *err);

static enum status dec_parse_any(void *ctx, const struct json *j, const char *path, struct err *err)
{
    return dec_parse(ctx, j, path, err);
}

static enum status dec_parse(struct tok_decoder *d, const struct json *j, const char *path, struct err *err)
{
    if (!json_is_object(j))
        return err_set(err, STATUS_FORMAT, "%s: expected an object", path);
    const char *type;
    enum status st = tok_json_str(j, "type", path, true, &type, err);
    if (st)
        return st;
    struct tok_dec step = {0};
    if (!strcmp(type, "Sequence")) {
        return tok_sequence_parse(d, j, "decoders", path, dec_parse_any, err);
    } else if (!strcmp(type, "ByteLevel")) {
        step.kind = TOK_DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        step.kind = TOK_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        step.kind = TOK_DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        step.kind = TOK_DEC_REPLACE;
        if ((st = tok_replace_parse(j, path, &step.pattern, &step.pattern_len, &step.re, &step.content,
                                    &step.content_len, err)))
            return st;
    } else if (!strcmp(type, "Strip")) {
        step.kind = TOK_DEC_STRIP;
        if ((st = dec_one_char(j, "content", path, &step.ch, err)) ||
            (st = tok_json_uint(j, "start", path, 1e6, 0, &step.start, err)) ||
            (st = tok_json_uint(j, "stop", path, 1e6, 0, &step.stop, err)))
            return st;
    } else if (!strcmp(type, "Metaspace")) {
        step.kind = TOK_DEC_METASPACE;
        const char *scheme;
        if ((st = dec_one_char(j, "replacement", path, &step.ch, err)) ||
            (st = tok_json_str(j, "prepend_scheme", path, false, &scheme, err)))
            return st;
        step.prepend = true;
        if (scheme && !strcmp(scheme, "never"))
            step.prepend = false;
        else if (scheme && strcmp(scheme, "always") && strcmp(scheme, "first"))
            return err_set(err, STATUS_UNSUPPORTED, "%s.prepend_scheme: \"%s\" is not supported", path,
                           scheme);
        const struct json *aps = json_get(j, "add_prefix_space");
        if (!scheme && json_is_bool(aps))
            step.prepend = json_bool(aps);
    } else {
        return err_set(err, STATUS_UNSUPPORTED, "%s.type: decoder \"%s\" is not supported", path, type);
    }
    return dec_add(d, &step, err);
}

enum status tok_decoder_parse(struct tok_decoder *d, const struct json *j, const char *path, struct err *err)
{
    if (json_is_null(j))
        return STATUS_OK;
    d->present = true;
    return dec_parse(d, j, path, err);
}

void tok_decoder_free(struct tok_decoder *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free(d->steps[i].pattern);
        free(d->steps[i].content);
        regex_free(d->steps[i].re);
    }
    free(d->steps);
    memset(d, 0, sizeof *d);
}

bool tok_bytelevel_decode_token(const char *s, size_t len, struct tok_buf *out)
{
    size_t mark = out->n;
    if (!tok_buf_reserve(out, len))
        return false;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += unicode_utf8_decode(s + i, len - i, &cp);
        int b = tok_bytelevel_byte(cp);
        if (b < 0) { /* not a ByteLevel token: its own bytes */
            out->n = mark;
            return tok_buf_put(out, s, len);
        }
        out->p[out->n++] = (char)b;
    }
    out->p[out->n] = 0;
    return true;
}

/* ---- the chain over a token list ---- */

struct dec_list {
    struct tok_buf text;
    struct tok_spans tok; /* [start, end) in text */
};

static bool list_add(struct dec_list *l, const char *s, size_t n)
{
    size_t at = l->text.n;
    return tok_buf_put(&l->text, s, n) && tok_spans_push(&l->tok, at, at + n, 0);
}

static void list_reset(struct dec_list *l)
{
    l->text.n = 0;
    l->tok.n = 0;
}

static void list_free(struct dec_list *l)
{
    tok_buf_free(&l->text);
    free(l->tok.v);
}

int tok_fallback_byte(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) {
            if (i == 3 && c == '+')
                continue;
            return -1;
        }
        v = v * 16 + d;
    }
    return v;
}

static bool dec_flush_bytes(struct dec_list *out, struct tok_buf *bytes)
{
    if (!bytes->n)
        return true;
    bool ok = true;
    if (unicode_utf8_validate(bytes->p, bytes->n, NULL)) {
        ok = list_add(out, bytes->p, bytes->n);
    } else {
        for (size_t i = 0; i < bytes->n && ok; i++)
            ok = list_add(out, "\xEF\xBF\xBD", 3);
    }
    bytes->n = 0;
    return ok;
}

static enum status dec_step_replace(const struct tok_dec *st, struct regex_scratch *rx,
                                    struct tok_spans *found, const struct dec_list *in, struct dec_list *out,
                                    struct err *err)
{
    size_t n = in->tok.n;
    for (size_t i = 0; i < n; i++) {
        const struct tok_match *t = &in->tok.v[i];
        const char *s = in->text.p + t->start;
        size_t len = t->end - t->start;
        enum status rc = tok_find_all(st->re, st->pattern, st->pattern_len, rx, s, len, found, err);
        if (rc)
            return rc;
        size_t at = out->text.n, last = 0;
        bool ok = true;
        for (size_t m = 0; m < found->n && ok; m++) {
            ok = tok_buf_put(&out->text, s + last, found->v[m].start - last) &&
                 tok_buf_put(&out->text, st->content, st->content_len);
            last = found->v[m].end;
        }
        ok = ok && tok_buf_put(&out->text, s + last, len - last) &&
             tok_spans_push(&out->tok, at, out->text.n, 0);
        if (!ok)
            return err_set(err, STATUS_NOMEM, "decoder: out of memory");
    }
    return STATUS_OK;
}

static enum status dec_step_strip(const struct tok_dec *st, const struct dec_list *in, struct dec_list *out,
                                  struct err *err)
{
    size_t n = in->tok.n;
    for (size_t i = 0; i < n; i++) {
        const struct tok_match *t = &in->tok.v[i];
        const char *s = in->text.p + t->start;
        size_t len = t->end - t->start, a = 0, b = len;
        for (size_t k = 0; k < st->start && a < len; k++) {
            uint32_t cp;
            size_t cl = unicode_utf8_decode(s + a, len - a, &cp);
            if (cp != st->ch)
                break;
            a += cl;
        }
        for (size_t k = 0; k < st->stop && b > a; k++) {
            size_t p = b - 1;
            while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80)
                p--;
            uint32_t cp;
            unicode_utf8_decode(s + p, b - p, &cp);
            if (cp != st->ch)
                break;
            b = p;
        }
        if (!list_add(out, s + a, b - a))
            return err_set(err, STATUS_NOMEM, "decoder: out of memory");
    }
    return STATUS_OK;
}

static enum status dec_step_metaspace(const struct tok_dec *st, const struct dec_list *in,
                                      struct dec_list *out, struct err *err)
{
    size_t n = in->tok.n;
    for (size_t i = 0; i < n; i++) {
        const struct tok_match *t = &in->tok.v[i];
        const char *s = in->text.p + t->start;
        size_t len = t->end - t->start, at = out->text.n;
        bool ok = tok_buf_reserve(&out->text, len);
        for (size_t k = 0; k < len && ok;) {
            uint32_t cp;
            size_t cl = unicode_utf8_decode(s + k, len - k, &cp);
            if (cp != st->ch)
                ok = tok_buf_put(&out->text, s + k, cl);
            else if (!(i == 0 && st->prepend))
                ok = tok_buf_put(&out->text, " ", 1);
            k += cl;
        }
        if (!ok || !tok_spans_push(&out->tok, at, out->text.n, 0))
            return err_set(err, STATUS_NOMEM, "decoder: out of memory");
    }
    return STATUS_OK;
}

static enum status dec_step(const struct tok_dec *st, struct regex_scratch *rx, struct tok_spans *found,
                            const struct dec_list *in, struct dec_list *out, struct err *err)
{
    list_reset(out);
    size_t n = in->tok.n;
    switch (st->kind) {
    case TOK_DEC_BYTELEVEL:
    case TOK_DEC_FUSE: {
        struct tok_buf raw = {0};
        bool ok = tok_buf_reserve(&raw, 0);
        for (size_t i = 0; i < n && ok; i++) {
            const struct tok_match *t = &in->tok.v[i];
            ok = st->kind == TOK_DEC_FUSE
                     ? tok_buf_put(&raw, in->text.p + t->start, t->end - t->start)
                     : tok_bytelevel_decode_token(in->text.p + t->start, t->end - t->start, &raw);
        }
        if (ok && st->kind == TOK_DEC_BYTELEVEL) {
            char *lossy = malloc(raw.n * 3 + 1);
            ok = lossy && list_add(out, lossy, unicode_utf8_lossy(raw.p, raw.n, lossy));
            free(lossy);
        } else if (ok) {
            ok = list_add(out, raw.p, raw.n);
        }
        tok_buf_free(&raw);
        return ok ? STATUS_OK : err_set(err, STATUS_NOMEM, "decoder: out of memory");
    }
    case TOK_DEC_BYTEFALLBACK: {
        struct tok_buf bytes = {0};
        bool ok = true;
        for (size_t i = 0; i < n && ok; i++) {
            const struct tok_match *t = &in->tok.v[i];
            int b = tok_fallback_byte(in->text.p + t->start, t->end - t->start);
            if (b >= 0) {
                char c = (char)b;
                ok = tok_buf_put(&bytes, &c, 1);
                continue;
            }
            ok = dec_flush_bytes(out, &bytes) && list_add(out, in->text.p + t->start, t->end - t->start);
        }
        ok = ok && dec_flush_bytes(out, &bytes);
        tok_buf_free(&bytes);
        return ok ? STATUS_OK : err_set(err, STATUS_NOMEM, "decoder: out of memory");
    }
    case TOK_DEC_REPLACE: return dec_step_replace(st, rx, found, in, out, err);
    case TOK_DEC_STRIP: return dec_step_strip(st, in, out, err);
    case TOK_DEC_METASPACE: return dec_step_metaspace(st, in, out, err);
    }
    PANIC("unknown decoder kind %d", (int)st->kind);
}

enum status tok_decoder_run(const struct tok_decoder *d, const char *const *tok, const size_t *tok_len,
                            size_t n, struct tok_buf *out, struct err *err)
{
    out->n = 0;
    if (!tok_buf_reserve(out, 0))
        return err_set(err, STATUS_NOMEM, "decoder: out of memory");
    out->p[0] = 0;
    if (!d->present) { /* no decoder: HF joins the tokens with spaces */
        for (size_t i = 0; i < n; i++)
            if ((i && !tok_buf_put(out, " ", 1)) || !tok_buf_put(out, tok[i], tok_len[i]))
                return err_set(err, STATUS_NOMEM, "decoder: out of memory");
        return STATUS_OK;
    }
    struct dec_list l[2] = {0};
    struct regex_scratch rx = {0};
    struct tok_spans found = {0};
    enum status st = STATUS_OK;
    for (size_t i = 0; i < n && !st; i++)
        if (!list_add(&l[0], tok[i], tok_len[i]))
            st = err_set(err, STATUS_NOMEM, "decoder: out of memory");
    int w = 0;
    for (size_t s = 0; s < d->n && !st; s++) {
        st = dec_step(&d->steps[s], &rx, &found, &l[w], &l[w ^ 1], err);
        w ^= 1;
    }
    for (size_t i = 0; i < l[w].tok.n && !st; i++) {
        const struct tok_match *t = &l[w].tok.v[i];
        if (!tok_buf_put(out, l[w].text.p + t->start, t->end - t->start))
            st = err_set(err, STATUS_NOMEM, "decoder: out of memory");
    }
    list_free(&l[0]);
    list_free(&l[1]);
    regex_scratch_free(&rx);
    free(found.v);
    return st;
}
