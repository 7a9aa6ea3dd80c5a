/* tok_detok.c — streaming detokenizer: decode as ids arrive, emitting only
 * text that later ids cannot change.
 *
 * The decoder chain runs incrementally: steps before the first joiner
 * (ByteLevel or Fuse) see one token at a time (Replace, Strip, Metaspace with
 * its first-token rule, ByteFallback holding a run of byte tokens); the
 * joiner turns the stream into one growing token (ByteLevel holds back an
 * incomplete UTF-8 tail); steps after it act on that single token's text
 * (Strip from the start / holding back up to `stop` trailing chars, Metaspace,
 * literal Replace holding back a partial match, Fuse). A chain outside this
 * shape (a regex Replace or ByteLevel/ByteFallback after a joiner) falls back
 * to keeping the ids and decoding them all at flush — still exact, just not
 * incremental. No decoder: tokens joined by spaces.
 * Invariant: concatenating all output == tokenizer_decode(all ids), and each
 * returned piece is whole UTF-8 characters.
 */
#include <stdlib.h>
#include <string.h>

#include "base/unicode.h"
#include "format/tok_internal.h"

struct detok_step_state {
    size_t n_in;        /* tokens seen (Metaspace first-token rule) / chars stripped (Strip) */
    bool lead_done;     /* Strip after the joiner: leading part passed */
    struct tok_buf buf; /* held bytes/text, or scratch for the step's output */
};

struct detok_impl {
    bool incremental;
    bool flushed;
    size_t join_at;     /* index of the joiner step; steps->n if none */
    size_t n_tokens;    /* tokens fed (no-decoder join) */
    struct tok_buf out; /* produced, not yet returned: out.p[out_pos..out.n) */
    size_t out_pos;
    struct tok_ids ids;          /* fallback: every id */
    struct detok_step_state *st; /* (steps->n) */
    struct regex_scratch rx;
    struct tok_spans found;
};

#define NOMEM(err) err_set(err, STATUS_NOMEM, "detokenizer: out of memory")

static enum status stream_text(struct detok_impl *im, const struct tok_decoder *d, size_t k, const char *s,
                               size_t n, struct err *err);

/* Longest proper prefix of pat that is a suffix of s[0..n). */
static size_t partial_suffix(const char *s, size_t n, const char *pat, size_t plen)
{
    size_t m = plen ? plen - 1 : 0;
    if (m > n)
        m = n;
    for (; m > 0; m--)
        if (!memcmp(s + n - m, pat, m))
            return m;
    return 0;
}

static enum status stream_text(struct detok_impl *im, const struct tok_decoder *d, size_t k, const char *s,
                               size_t n, struct err *err)
{
    if (k == d->n)
        return tok_buf_put(&im->out, s, n) ? STATUS_OK : NOMEM(err);
    const struct tok_dec *step = &d->steps[k];
    struct detok_step_state *ss = &im->st[k];
    switch (step->kind) {
    case TOK_DEC_FUSE: return stream_text(im, d, k + 1, s, n, err);
    case TOK_DEC_METASPACE: { /* one token after the joiner: always token 0 */
        ss->buf.n = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t cl = unicode_utf8_decode(s + i, n - i, &cp);
            bool ok = cp != step->ch ? tok_buf_put(&ss->buf, s + i, cl)
                                     : (step->prepend ? true : tok_buf_put(&ss->buf, " ", 1));
            if (!ok)
                return NOMEM(err);
            i += cl;
        }
        return stream_text(im, d, k + 1, ss->buf.p ? ss->buf.p : "", ss->buf.n, err);
    }
    case TOK_DEC_STRIP: {
        size_t a = 0;
        while (!ss->lead_done && a < n) {
            uint32_t cp;
            size_t cl = unicode_utf8_decode(s + a, n - a, &cp);
            if (ss->n_in >= step->start || cp != step->ch) {
                ss->lead_done = true;
                break;
            }
            ss->n_in++;
            a += cl;
        }
        if (!step->stop)
            return stream_text(im, d, k + 1, s + a, n - a, err);
        /* hold back up to `stop` trailing content chars */
        if (!tok_buf_put(&ss->buf, s + a, n - a))
            return NOMEM(err);
        size_t b = ss->buf.n, held = 0;
        while (b > 0 && held < step->stop) {
            size_t p = b - 1;
            while (p > 0 && ((unsigned char)ss->buf.p[p] & 0xC0) == 0x80)
                p--;
            uint32_t cp;
            unicode_utf8_decode(ss->buf.p + p, b - p, &cp);
            if (cp != step->ch)
                break;
            b = p;
            held++;
        }
        enum status rc = stream_text(im, d, k + 1, ss->buf.p, b, err);
        memmove(ss->buf.p, ss->buf.p + b, ss->buf.n - b);
        ss->buf.n -= b;
        return rc;
    }
    case TOK_DEC_REPLACE: { /* literal only (checked at init) */
        if (!tok_buf_put(&ss->buf, s, n))
            return NOMEM(err);
        struct tok_buf repl = {0};
        const char *t = ss->buf.p;
        size_t len = ss->buf.n, last = 0;
        bool ok = true;
        if (step->pattern_len) {
            for (size_t pos = 0; ok && pos + step->pattern_len <= len;) {
                const char *hit = memmem(t + pos, len - pos, step->pattern, step->pattern_len);
                if (!hit)
                    break;
                size_t at = (size_t)(hit - t);
                ok = tok_buf_put(&repl, t + last, at - last) &&
                     tok_buf_put(&repl, step->content, step->content_len);
                pos = last = at + step->pattern_len;
            }
        }
        size_t keep = partial_suffix(t + last, len - last, step->pattern, step->pattern_len);
        ok = ok && tok_buf_put(&repl, t + last, len - last - keep);
        enum status rc = ok ? stream_text(im, d, k + 1, repl.p ? repl.p : "", repl.n, err) : NOMEM(err);
        tok_buf_free(&repl);
        memmove(ss->buf.p, ss->buf.p + len - keep, keep);
        ss->buf.n = keep;
        return rc;
    }
    case TOK_DEC_BYTELEVEL:
    case TOK_DEC_BYTEFALLBACK: break;
    }
    PANIC("detokenizer: step %d after the joiner", (int)step->kind);
}

/* Emits the complete UTF-8 prefix of the joiner's held bytes (all of it when final). */
static enum status bytelevel_emit(struct detok_impl *im, const struct tok_decoder *d, size_t k, bool final,
                                  struct err *err)
{
    struct tok_buf *b = &im->st[k].buf;
    size_t tail = final ? 0 : unicode_utf8_incomplete_tail(b->p, b->n);
    size_t take = b->n - tail;
    if (!take)
        return STATUS_OK;
    char *lossy = malloc(take * 3 + 1);
    if (!lossy)
        return NOMEM(err);
    size_t ln = unicode_utf8_lossy(b->p, take, lossy);
    memmove(b->p, b->p + take, tail);
    b->n = tail;
    enum status rc = stream_text(im, d, k + 1, lossy, ln, err);
    free(lossy);
    return rc;
}

static enum status stream_token(struct detok_impl *im, const struct tok_decoder *d, size_t k, const char *s,
                                size_t n, struct err *err);

static enum status fallback_flush(struct detok_impl *im, const struct tok_decoder *d, size_t k,
                                  struct err *err)
{
    struct tok_buf *b = &im->st[k].buf;
    if (!b->n)
        return STATUS_OK;
    /* copy out: the next steps may be re-entered while we iterate */
    size_t n = b->n;
    char *bytes = malloc(n);
    if (!bytes)
        return NOMEM(err);
    memcpy(bytes, b->p, n);
    b->n = 0;
    enum status rc = STATUS_OK;
    if (unicode_utf8_validate(bytes, n, NULL))
        rc = stream_token(im, d, k + 1, bytes, n, err);
    else
        for (size_t i = 0; i < n && !rc; i++)
            rc = stream_token(im, d, k + 1, "\xEF\xBF\xBD", 3, err);
    free(bytes);
    return rc;
}

static enum status stream_token(struct detok_impl *im, const struct tok_decoder *d, size_t k, const char *s,
                                size_t n, struct err *err)
{
    if (k == d->n)
        return tok_buf_put(&im->out, s, n) ? STATUS_OK : NOMEM(err);
    const struct tok_dec *step = &d->steps[k];
    struct detok_step_state *ss = &im->st[k];
    if (k == im->join_at) {
        if (step->kind == TOK_DEC_FUSE)
            return stream_text(im, d, k + 1, s, n, err);
        if (!tok_bytelevel_decode_token(s, n, &ss->buf))
            return NOMEM(err);
        return bytelevel_emit(im, d, k, false, err);
    }
    switch (step->kind) {
    case TOK_DEC_BYTEFALLBACK: {
        int byte = tok_fallback_byte(s, n);
        if (byte >= 0) {
            char c = (char)byte;
            return tok_buf_put(&ss->buf, &c, 1) ? STATUS_OK : NOMEM(err);
        }
        enum status rc = fallback_flush(im, d, k, err);
        return rc ? rc : stream_token(im, d, k + 1, s, n, err);
    }
    case TOK_DEC_REPLACE: {
        enum status rc =
            tok_find_all(step->re, step->pattern, step->pattern_len, &im->rx, s, n, &im->found, err);
        if (rc)
            return rc;
        ss->buf.n = 0;
        size_t last = 0;
        bool ok = tok_buf_reserve(&ss->buf, n);
        for (size_t m = 0; m < im->found.n && ok; m++) {
            ok = tok_buf_put(&ss->buf, s + last, im->found.v[m].start - last) &&
                 tok_buf_put(&ss->buf, step->content, step->content_len);
            last = im->found.v[m].end;
        }
        if (!ok || !tok_buf_put(&ss->buf, s + last, n - last))
            return NOMEM(err);
        return stream_token(im, d, k + 1, ss->buf.p, ss->buf.n, err);
    }
    case TOK_DEC_STRIP: {
        size_t a = 0, b = n;
        for (size_t q = 0; q < step->start && a < n; q++) {
            uint32_t cp;
            size_t cl = unicode_utf8_decode(s + a, n - a, &cp);
            if (cp != step->ch)
                break;
            a += cl;
        }
        for (size_t q = 0; q < step->stop && b > a; q++) {
            size_t p = b - 1;
            while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80)
                p--;
            uint32_t cp;
            unicode_utf8_decode(s + p, b - p, &cp);
            if (cp != step->ch)
                break;
            b = p;
        }
        return stream_token(im, d, k + 1, s + a, b - a, err);
    }
    case TOK_DEC_METASPACE: {
        bool first = ss->n_in++ == 0;
        ss->buf.n = 0;
        if (!tok_buf_reserve(&ss->buf, n))
            return NOMEM(err);
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t cl = unicode_utf8_decode(s + i, n - i, &cp);
            bool ok = cp != step->ch ? tok_buf_put(&ss->buf, s + i, cl)
                                     : ((first && step->prepend) ? true : tok_buf_put(&ss->buf, " ", 1));
            if (!ok)
                return NOMEM(err);
            i += cl;
        }
        return stream_token(im, d, k + 1, ss->buf.p, ss->buf.n, err);
    }
    case TOK_DEC_BYTELEVEL:
    case TOK_DEC_FUSE: break;
    }
    PANIC("detokenizer: joiner %d before join_at", (int)step->kind);
}

static enum status detok_setup(struct detok_stream *s, struct err *err)
{
    const struct tok_decoder *d = &s->tok->decoder;
    struct detok_impl *im = calloc(1, sizeof *im);
    if (!im)
        return NOMEM(err);
    im->st = calloc(d->n ? d->n : 1, sizeof *im->st);
    if (!im->st) {
        free(im);
        return NOMEM(err);
    }
    im->incremental = true;
    im->join_at = d->n;
    for (size_t k = 0; k < d->n; k++) {
        enum tok_dec_kind kind = d->steps[k].kind;
        if (k < im->join_at) {
            if (kind == TOK_DEC_BYTELEVEL || kind == TOK_DEC_FUSE)
                im->join_at = k;
        } else if (kind == TOK_DEC_BYTELEVEL || kind == TOK_DEC_BYTEFALLBACK ||
                   (kind == TOK_DEC_REPLACE && d->steps[k].re)) {
            im->incremental = false;
        }
    }
    s->impl = im;
    return STATUS_OK;
}

void detok_stream_init(struct detok_stream *s, const struct tokenizer *t, bool skip_special)
{
    s->tok = t;
    s->skip_special = skip_special;
    s->impl = NULL;
}

/* Moves up to cap bytes of whole chars from the pending output to out. */
static void detok_deliver(struct detok_impl *im, char *out, size_t cap, size_t *n_out)
{
    size_t avail = im->out.n - im->out_pos;
    size_t take = avail <= cap ? avail : cap;
    if (take < avail)
        while (take > 0 && ((unsigned char)im->out.p[im->out_pos + take] & 0xC0) == 0x80)
            take--;
    if (take)
        memcpy(out, im->out.p + im->out_pos, take);
    im->out_pos += take;
    if (im->out_pos == im->out.n)
        im->out.n = im->out_pos = 0;
    *n_out = take;
}

enum status detok_stream_push(struct detok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out,
                              struct err *err)
{
    *n_out = 0;
    if (cap < 4)
        return err_set(err, STATUS_INVALID, "detokenizer: output buffer of %zu bytes (need >= 4)", cap);
    size_t len;
    const char *text = tok_id_text(s->tok, id, &len);
    if (!text)
        return err_set(err, STATUS_INVALID, "%s: id %d is not in the vocabulary (size %d)", s->tok->name,
                       (int)id, (int)s->tok->n_ids);
    if (!s->impl) {
        enum status st = detok_setup(s, err);
        if (st)
            return st;
    }
    struct detok_impl *im = s->impl;
    if (im->flushed)
        return err_set(err, STATUS_INVALID, "detokenizer: push after flush");
    if (!(s->skip_special && s->tok->special[id])) {
        const struct tok_decoder *d = &s->tok->decoder;
        enum status st = STATUS_OK;
        if (!im->incremental) {
            if (!tok_ids_push(&im->ids, id))
                return NOMEM(err);
        } else if (!d->present) {
            if ((im->n_tokens && !tok_buf_put(&im->out, " ", 1)) || !tok_buf_put(&im->out, text, len))
                return NOMEM(err);
        } else {
            st = stream_token(im, d, 0, text, len, err);
        }
        im->n_tokens++;
        if (st)
            return st;
    }
    detok_deliver(im, out, cap, n_out);
    return STATUS_OK;
}

enum status detok_stream_flush(struct detok_stream *s, char *out, size_t cap, size_t *n_out, struct err *err)
{
    *n_out = 0;
    if (cap < 4)
        return err_set(err, STATUS_INVALID, "detokenizer: output buffer of %zu bytes (need >= 4)", cap);
    if (!s->impl) {
        enum status st = detok_setup(s, err);
        if (st)
            return st;
    }
    struct detok_impl *im = s->impl;
    const struct tok_decoder *d = &s->tok->decoder;
    if (!im->flushed) {
        im->flushed = true;
        enum status st = STATUS_OK;
        if (!im->incremental) {
            char *text = NULL;
            size_t n = 0;
            st = tokenizer_decode(s->tok, im->ids.ids, im->ids.n, false, &text, &n, err);
            if (!st && !tok_buf_put(&im->out, text, n))
                st = NOMEM(err);
            free(text);
        } else if (d->present) {
            for (size_t k = 0; k < d->n && !st; k++) {
                const struct tok_dec *step = &d->steps[k];
                struct detok_step_state *ss = &im->st[k];
                if (k < im->join_at) {
                    if (step->kind == TOK_DEC_BYTEFALLBACK)
                        st = fallback_flush(im, d, k, err);
                } else if (k == im->join_at) {
                    if (step->kind == TOK_DEC_BYTELEVEL)
                        st = bytelevel_emit(im, d, k, true, err);
                } else if (step->kind == TOK_DEC_REPLACE && ss->buf.n) {
                    size_t n = ss->buf.n;
                    ss->buf.n = 0;
                    st = stream_text(im, d, k + 1, ss->buf.p, n, err);
                } else if (step->kind == TOK_DEC_STRIP) {
                    ss->buf.n = 0; /* the held trailing chars are stripped */
                }
            }
        }
        if (st)
            return st;
    }
    detok_deliver(im, out, cap, n_out);
    return STATUS_OK;
}

void detok_stream_free(struct detok_stream *s)
{
    struct detok_impl *im = s ? s->impl : NULL;
    if (!im)
        return;
    size_t n = s->tok ? s->tok->decoder.n : 0;
    for (size_t k = 0; k < n; k++)
        tok_buf_free(&im->st[k].buf);
    free(im->st);
    tok_buf_free(&im->out);
    tok_ids_free(&im->ids);
    regex_scratch_free(&im->rx);
    free(im->found.v);
    free(im);
    s->impl = NULL;
}
