/* tok_pretokenize.c — HF pre-tokenizers: Split, ByteLevel, Digits, Metaspace,
 * Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, Sequence.
 *
 * A segment becomes a list of pieces (spans of tok_scratch.text); each step
 * maps pieces to pieces exactly like PreTokenizedString::split with the
 * step's SplitDelimiterBehavior, dropping empty pieces. Steps that rewrite
 * text (Metaspace, ByteLevel's prefix space and mapping) append the new text
 * to the same buffer, so spans stay valid.
 * Invariant: a TOK_PIECE_BYTES piece (raw bytes standing for ByteLevel chars)
 * only comes out of a ByteLevel step that is the last step; earlier
 * ByteLevel steps write the mapped chars.
 * Regexes follow Oniguruma (REGEX_ONIG), the engine HF uses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/unicode.h"
#include "format/tok_internal.h"

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char WHITESPACE_PATTERN[] = "\\w+|[^\\w\\s]+";

/* ---- patterns ---- */

enum status tok_replace_parse(const struct json *j, const char *path, char **pattern, size_t *pattern_len,
                              struct regex **re, char **content, size_t *content_len, struct err *err)
{
    const char *c;
    char sub[512];
    snprintf(sub, sizeof sub, "%s.pattern", path);
    enum status st;
    if ((st = tok_json_str(j, "content", path, true, &c, err)) ||
        (st = tok_pattern_parse(json_get(j, "pattern"), sub, pattern, pattern_len, re, err)))
        return st;
    *content_len = strlen(c);
    if (!(*content = tok_strdup_n(c, *content_len))) {
        free(*pattern);
        regex_free(*re);
        *pattern = NULL;
        *re = NULL;
        return err_set(err, STATUS_NOMEM, "%s: out of memory", path);
    }
    return STATUS_OK;
}

enum status tok_sequence_parse(void *ctx, const struct json *j, const char *key, const char *path, tok_parse_fn parse,
                               struct err *err)
{
    const struct json *list = json_get(j, key);
    if (!json_is_array(list))
        return err_set(err, STATUS_FORMAT, "%s.%s: expected an array", path, key);
    char sub[512];
    size_t i = 0;
    enum status st;
    for (const struct json *e = json_child(list); e; e = json_next(e), i++) {
        snprintf(sub, sizeof sub, "%s.%s[%zu]", path, key, i);
        if ((st = parse(ctx, e, sub, err)))
            return st;
    }
    return STATUS_OK;
}

enum status tok_pattern_parse(const struct json *pat, const char *path, char **lit, size_t *lit_len,
                              struct regex **re, struct err *err)
{
    *lit = NULL;
    *lit_len = 0;
    *re = NULL;
    if (!json_is_object(pat))
        return err_set(err, STATUS_FORMAT, "%s: expected {\"String\": ...} or {\"Regex\": ...}", path);
    const char *s;
    enum status st;
    if (json_get(pat, "String")) {
        if ((st = tok_json_str(pat, "String", path, true, &s, err)))
            return st;
        *lit_len = strlen(s);
        *lit = tok_strdup_n(s, *lit_len);
        return *lit ? STATUS_OK : err_set(err, STATUS_NOMEM, "%s: out of memory", path);
    }
    if (json_get(pat, "Regex")) {
        if ((st = tok_json_str(pat, "Regex", path, true, &s, err)))
            return st;
        char what[600];
        snprintf(what, sizeof what, "%s.Regex", path);
        return regex_compile(re, s, strlen(s), REGEX_ONIG, what, err);
    }
    return err_set(err, STATUS_FORMAT, "%s: expected {\"String\": ...} or {\"Regex\": ...}", path);
}

enum status tok_find_all(const struct regex *re, const char *lit, size_t lit_len, struct regex_scratch *rx,
                         const char *s, size_t len, struct tok_spans *out, struct err *err)
{
    out->n = 0;
    if (!re) {
        if (!lit_len)
            return STATUS_OK;
        for (size_t pos = 0; pos + lit_len <= len;) {
            const char *hit = memmem(s + pos, len - pos, lit, lit_len);
            if (!hit)
                break;
            size_t a = (size_t)(hit - s);
            if (!tok_spans_push(out, a, a + lit_len, 1))
                return err_set(err, STATUS_NOMEM, "pattern: out of memory");
            pos = a + lit_len;
        }
        return STATUS_OK;
    }
    /* onig's find_iter: an empty match right where the previous one ended is
     * skipped by stepping one char. */
    size_t pos = 0, last_end = (size_t)-1;
    while (pos <= len) {
        bool found;
        size_t a, b;
        enum status st = regex_find(re, rx, s, len, pos, &found, &a, &b, err);
        if (st)
            return st;
        if (!found)
            break;
        if (a < pos || b < a || b > len)
            return err_set(err, STATUS_UNSUPPORTED, "regex: match outside the subject (\\K or lookbehind?)");
        if (a == b && last_end == b) {
            pos += pos < len ? unicode_utf8_char_len((unsigned char)s[pos]) : 1;
            continue;
        }
        if (!tok_spans_push(out, a, b, 1))
            return err_set(err, STATUS_NOMEM, "pattern: out of memory");
        pos = b;
        last_end = b;
    }
    return STATUS_OK;
}

/* ---- parsing ---- */

static enum status tok_behavior_parse(const struct json *j, const char *path, enum tok_split_behavior dflt,
                                      enum tok_split_behavior *out, struct err *err)
{
    const char *b;
    enum status st = tok_json_str(j, "behavior", path, false, &b, err);
    if (st)
        return st;
    *out = dflt;
    if (!b)
        return STATUS_OK;
    if (!strcmp(b, "Removed"))
        *out = TOK_SPLIT_REMOVED;
    else if (!strcmp(b, "Isolated"))
        *out = TOK_SPLIT_ISOLATED;
    else if (!strcmp(b, "MergedWithPrevious"))
        *out = TOK_SPLIT_MERGED_WITH_PREVIOUS;
    else if (!strcmp(b, "MergedWithNext"))
        *out = TOK_SPLIT_MERGED_WITH_NEXT;
    else if (!strcmp(b, "Contiguous"))
        *out = TOK_SPLIT_CONTIGUOUS;
    else
        return err_set(err, STATUS_UNSUPPORTED, "%s.behavior: \"%s\" is not a split behavior", path, b);
    return STATUS_OK;
}

static enum status tok_pre_add(struct tok_pretokenizer *pt, struct tok_pre *step, struct err *err)
{
    struct tok_pre *v = realloc(pt->steps, (pt->n + 1) * sizeof *v);
    if (!v) {
        regex_free(step->re);
        free(step->literal);
        return err_set(err, STATUS_NOMEM, "out of memory loading the pre-tokenizer");
    }
    pt->steps = v;
    pt->steps[pt->n++] = *step;
    return STATUS_OK;
}

static enum status tok_metaspace_parse(const struct json *j, const char *path, struct tok_pre *step,
                                       struct err *err)
{
    const char *rep, *scheme;
    enum status st;
    if ((st = tok_json_str(j, "replacement", path, true, &rep, err)) ||
        (st = tok_json_str(j, "prepend_scheme", path, false, &scheme, err)) ||
        (st = tok_json_bool(j, "split", path, true, &step->split, err)))
        return st;
    size_t rl = strlen(rep);
    if (rl == 0 || unicode_utf8_decode(rep, rl, &step->replacement) != rl)
        return err_set(err, STATUS_FORMAT, "%s.replacement: expected exactly one character", path);
    step->prepend = TOK_PREPEND_ALWAYS;
    if (scheme) {
        if (!strcmp(scheme, "always"))
            step->prepend = TOK_PREPEND_ALWAYS;
        else if (!strcmp(scheme, "first"))
            step->prepend = TOK_PREPEND_FIRST;
        else if (!strcmp(scheme, "never"))
            step->prepend = TOK_PREPEND_NEVER;
        else
            return err_set(err, STATUS_UNSUPPORTED, "%s.prepend_scheme: \"%s\" is not supported", path,
                           scheme);
    }
    const struct json *aps = json_get(j, "add_prefix_space");
    if (json_is_bool(aps) && !json_bool(aps)) {
        if (scheme && step->prepend != TOK_PREPEND_NEVER)
            return err_set(err, STATUS_FORMAT, "%s: add_prefix_space does not match prepend_scheme", path);
        step->prepend = TOK_PREPEND_NEVER;
    }
    return STATUS_OK;
}

enum status tok_pretokenizer_parse(struct tok_pretokenizer *pt, const struct json *j, const char *path,
                                   struct err *err);

static enum status pre_parse_any(void *ctx, const struct json *j, const char *path, struct err *err)
{
    return tok_pretokenizer_parse(ctx, j, path, err);
}

enum status tok_pretokenizer_parse(struct tok_pretokenizer *pt, const struct json *j, const char *path,
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
    char sub[512];
    struct tok_pre step = {.behavior = TOK_SPLIT_ISOLATED};
    if (!strcmp(type, "Sequence")) {
        return tok_sequence_parse(pt, j, "pretokenizers", path, pre_parse_any, err);
    } else if (!strcmp(type, "Split")) {
        step.kind = TOK_PRE_SPLIT;
        snprintf(sub, sizeof sub, "%s.pattern", path);
        if ((st = tok_behavior_parse(j, path, TOK_SPLIT_ISOLATED, &step.behavior, err)) ||
            (st = tok_json_bool(j, "invert", path, false, &step.invert, err)) ||
            (st = tok_pattern_parse(json_get(j, "pattern"), sub, &step.literal, &step.literal_len, &step.re,
                                    err)))
            return st;
    } else if (!strcmp(type, "ByteLevel")) {
        step.kind = TOK_PRE_BYTELEVEL;
        bool use_regex;
        if ((st = tok_json_bool(j, "add_prefix_space", path, true, &step.add_prefix_space, err)) ||
            (st = tok_json_bool(j, "use_regex", path, true, &use_regex, err)))
            return st;
        if (use_regex) {
            snprintf(sub, sizeof sub, "%s (GPT-2 regex)", path);
            if ((st = regex_compile(&step.re, GPT2_PATTERN, strlen(GPT2_PATTERN), REGEX_ONIG, sub, err)))
                return st;
        }
    } else if (!strcmp(type, "Digits")) {
        step.kind = TOK_PRE_DIGITS;
        if ((st = tok_json_bool(j, "individual_digits", path, false, &step.individual, err)))
            return st;
    } else if (!strcmp(type, "Metaspace")) {
        step.kind = TOK_PRE_METASPACE;
        if ((st = tok_metaspace_parse(j, path, &step, err)))
            return st;
    } else if (!strcmp(type, "Whitespace")) {
        step.kind = TOK_PRE_WHITESPACE;
        snprintf(sub, sizeof sub, "%s (whitespace regex)", path);
        if ((st = regex_compile(&step.re, WHITESPACE_PATTERN, strlen(WHITESPACE_PATTERN), REGEX_ONIG, sub,
                                err)))
            return st;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        step.kind = TOK_PRE_WHITESPACE_SPLIT;
    } else if (!strcmp(type, "Punctuation")) {
        step.kind = TOK_PRE_PUNCTUATION;
        if ((st = tok_behavior_parse(j, path, TOK_SPLIT_ISOLATED, &step.behavior, err)))
            return st;
    } else if (!strcmp(type, "BertPreTokenizer")) {
        step.kind = TOK_PRE_BERT;
    } else {
        return err_set(err, STATUS_UNSUPPORTED, "%s.type: pre-tokenizer \"%s\" is not supported", path, type);
    }
    return tok_pre_add(pt, &step, err);
}

void tok_pretokenizer_free(struct tok_pretokenizer *pt)
{
    for (size_t i = 0; i < pt->n; i++) {
        regex_free(pt->steps[i].re);
        free(pt->steps[i].literal);
    }
    free(pt->steps);
    memset(pt, 0, sizeof *pt);
}

/* ---- applying ---- */

#define NOMEM(err) err_set(err, STATUS_NOMEM, "pre-tokenizer: out of memory")

/* Cuts piece p (text t, length len) at the spans in sc->found (sorted, non-
 * overlapping) and emits the parts kept by `behavior` to out. */
static enum status tok_split_emit(struct tok_scratch *sc, const struct tok_piece *p, bool invert,
                                  enum tok_split_behavior behavior, struct tok_pieces *out, struct err *err)
{
    struct tok_spans *parts = &sc->parts;
    parts->n = 0;
    size_t prev = 0;
    for (size_t m = 0; m < sc->found.n; m++) {
        const struct tok_match *mt = &sc->found.v[m];
        if (prev != mt->start && !tok_spans_push(parts, prev, mt->start, 0))
            return NOMEM(err);
        if (!tok_spans_push(parts, mt->start, mt->end, 1))
            return NOMEM(err);
        prev = mt->end;
    }
    if (prev != p->len && !tok_spans_push(parts, prev, p->len, 0))
        return NOMEM(err);
    if (invert)
        for (size_t i = 0; i < parts->n; i++)
            parts->v[i].id ^= 1;

    size_t n = parts->n;
    struct tok_match *v = parts->v;
    size_t w = 0; /* parts kept, compacted in place */
    switch (behavior) {
    case TOK_SPLIT_ISOLATED: w = n; break;
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!v[i].id)
                v[w++] = v[i];
        break;
    case TOK_SPLIT_CONTIGUOUS: {
        int prev_match = 0;
        for (size_t i = 0; i < n; i++) {
            if (v[i].id == prev_match && w > 0)
                v[w - 1].end = v[i].end;
            else
                v[w++] = v[i];
            prev_match = v[i].id;
        }
        break;
    }
    case TOK_SPLIT_MERGED_WITH_PREVIOUS: {
        int prev_match = 0;
        for (size_t i = 0; i < n; i++) {
            if (v[i].id && !prev_match && w > 0)
                v[w - 1].end = v[i].end;
            else
                v[w++] = v[i];
            prev_match = v[i].id;
        }
        break;
    }
    case TOK_SPLIT_MERGED_WITH_NEXT: {
        /* HF folds from the right: a match whose right neighbour is not a
         * match is glued to the front of it. */
        size_t pending = (size_t)-1;
        for (size_t i = 0; i < n; i++) {
            bool glue = v[i].id && i + 1 < n && !v[i + 1].id;
            if (glue) {
                pending = v[i].start;
                continue;
            }
            struct tok_match m = v[i];
            if (pending != (size_t)-1 && !v[i].id) {
                m.start = pending;
                pending = (size_t)-1;
            }
            v[w++] = m;
        }
        break;
    }
    }
    for (size_t i = 0; i < w; i++) {
        if (v[i].end == v[i].start)
            continue;
        unsigned flags = (p->flags & TOK_PIECE_ORIGIN) && v[i].start == 0 ? TOK_PIECE_ORIGIN : 0;
        if (!tok_pieces_push(out, p->off + v[i].start, v[i].end - v[i].start, flags))
            return NOMEM(err);
    }
    return STATUS_OK;
}

enum tok_pred { TOK_PRED_NUMERIC, TOK_PRED_WHITESPACE, TOK_PRED_PUNCT };

/* Each char satisfying pred is one match (HF's `impl Pattern for Fn(char) -> bool`). */
static enum status tok_find_chars(struct tok_scratch *sc, const char *t, size_t len, enum tok_pred pred,
                                  struct err *err)
{
    sc->found.n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = unicode_utf8_decode(t + i, len - i, &cp);
        bool hit = pred == TOK_PRED_NUMERIC ? unicode_is_numeric(cp)
                   : pred == TOK_PRED_WHITESPACE
                       ? unicode_is_whitespace(cp)
                       : (cp < 0x80 ? (cp > 0x20 && cp < 0x7F && !(cp >= '0' && cp <= '9') &&
                                       !((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z'))
                                    : unicode_is_punctuation(cp));
        if (hit && !tok_spans_push(&sc->found, i, i + k, 1))
            return NOMEM(err);
        i += k;
    }
    return STATUS_OK;
}

/* Appends text to sc->text; returns its offset through *off. */
static bool tok_text_put(struct tok_scratch *sc, const void *s, size_t n, size_t *off)
{
    *off = sc->text.n;
    return tok_buf_put(&sc->text, s, n);
}

/* BERT: whitespace (removed), then punctuation (isolated) on each part. */
static enum status tok_pre_bert(struct tok_scratch *sc, const struct tok_piece *p, struct tok_pieces *out,
                                struct err *err)
{
    enum status rc;
    if ((rc = tok_find_chars(sc, sc->text.p + p->off, p->len, TOK_PRED_WHITESPACE, err)))
        return rc;
    size_t first = out->n;
    if ((rc = tok_split_emit(sc, p, false, TOK_SPLIT_REMOVED, out, err)))
        return rc;
    size_t n_words = out->n - first;
    struct tok_piece *words = malloc((n_words ? n_words : 1) * sizeof *words);
    if (!words)
        return NOMEM(err);
    if (n_words)
        memcpy(words, out->v + first, n_words * sizeof *words);
    out->n = first;
    for (size_t w = 0; w < n_words && !rc; w++) {
        rc = tok_find_chars(sc, sc->text.p + words[w].off, words[w].len, TOK_PRED_PUNCT, err);
        if (!rc)
            rc = tok_split_emit(sc, &words[w], false, TOK_SPLIT_ISOLATED, out, err);
    }
    free(words);
    return rc;
}

static enum status tok_pre_metaspace(const struct tok_pre *st, struct tok_scratch *sc,
                                     const struct tok_piece *pp, struct tok_pieces *out, struct err *err)
{
    const struct tok_piece p = *pp;
    enum status rc;
    char rep[4];
    size_t rl = unicode_utf8_encode(st->replacement, rep);
    size_t off = sc->text.n;
    bool starts_rep = p.len >= rl && memcmp(sc->text.p + p.off, rep, rl) == 0;
    /* a leading ' ' becomes the replacement too */
    bool starts_space = p.len > 0 && sc->text.p[p.off] == ' ';
    bool prepend = !starts_rep && !starts_space &&
                   (st->prepend == TOK_PREPEND_ALWAYS ||
                    (st->prepend == TOK_PREPEND_FIRST && (p.flags & TOK_PIECE_ORIGIN)));
    if (prepend && !tok_buf_put(&sc->text, rep, rl))
        return NOMEM(err);
    for (size_t k = 0; k < p.len; k++) {
        /* text may move while we append: index it afresh */
        char c = sc->text.p[p.off + k];
        if (!(c == ' ' ? tok_buf_put(&sc->text, rep, rl) : tok_buf_put(&sc->text, &c, 1)))
            return NOMEM(err);
    }
    struct tok_piece q = {off, sc->text.n - off, p.flags & TOK_PIECE_ORIGIN};
    if (!st->split) {
        if (q.len && !tok_pieces_push(out, q.off, q.len, q.flags))
            return NOMEM(err);
        return STATUS_OK;
    }
    if ((rc = tok_find_all(NULL, rep, rl, &sc->rx, sc->text.p + q.off, q.len, &sc->found, err)) ||
        (rc = tok_split_emit(sc, &q, false, TOK_SPLIT_MERGED_WITH_NEXT, out, err)))
        return rc;
    return STATUS_OK;
}

/* The piece is taken by value: a prefix space rewrites its offset and length. */
static enum status tok_pre_bytelevel(const struct tok_pre *st, bool last, struct tok_scratch *sc,
                                     struct tok_piece p, struct tok_pieces *out, struct err *err)
{
    enum status rc;
    if (st->add_prefix_space && !(p.len > 0 && sc->text.p[p.off] == ' ')) {
        size_t off;
        if (!tok_text_put(sc, " ", 1, &off) || !tok_buf_reserve(&sc->text, p.len))
            return NOMEM(err);
        memcpy(sc->text.p + sc->text.n, sc->text.p + p.off, p.len);
        sc->text.n += p.len;
        sc->text.p[sc->text.n] = 0;
        p.off = off;
        p.len += 1;
    }
    size_t first = out->n;
    if (st->re) {
        if ((rc = tok_find_all(st->re, NULL, 0, &sc->rx, sc->text.p + p.off, p.len, &sc->found, err)) ||
            (rc = tok_split_emit(sc, &p, false, TOK_SPLIT_ISOLATED, out, err)))
            return rc;
    } else if (p.len && !tok_pieces_push(out, p.off, p.len, p.flags)) {
        return NOMEM(err);
    }
    for (size_t q = first; q < out->n; q++) {
        if (last) {
            out->v[q].flags |= TOK_PIECE_BYTES;
            continue;
        }
        size_t off = sc->text.n;
        for (size_t k = 0; k < out->v[q].len; k++) {
            char u[4];
            size_t ul =
                unicode_utf8_encode(tok_bytelevel_char((unsigned char)sc->text.p[out->v[q].off + k]), u);
            if (!tok_buf_put(&sc->text, u, ul))
                return NOMEM(err);
        }
        out->v[q].off = off;
        out->v[q].len = sc->text.n - off;
    }
    return STATUS_OK;
}

static enum status tok_pre_step(const struct tok_pre *st, bool last, struct tok_scratch *sc,
                                const struct tok_pieces *in, struct tok_pieces *out, struct err *err)
{
    enum status rc;
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        struct tok_piece p = in->v[i];
        ASSERT(!(p.flags & TOK_PIECE_BYTES));
        switch (st->kind) {
        case TOK_PRE_SPLIT:
        case TOK_PRE_WHITESPACE:
            if ((rc = tok_find_all(st->re, st->literal, st->literal_len, &sc->rx, sc->text.p + p.off, p.len,
                                   &sc->found, err)))
                return rc;
            if (st->kind == TOK_PRE_WHITESPACE)
                rc = tok_split_emit(sc, &p, true, TOK_SPLIT_REMOVED, out, err);
            else
                rc = tok_split_emit(sc, &p, st->invert, st->behavior, out, err);
            if (rc)
                return rc;
            break;
        case TOK_PRE_DIGITS:
            if ((rc = tok_find_chars(sc, sc->text.p + p.off, p.len, TOK_PRED_NUMERIC, err)) ||
                (rc = tok_split_emit(sc, &p, false,
                                     st->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, out, err)))
                return rc;
            break;
        case TOK_PRE_WHITESPACE_SPLIT:
            if ((rc = tok_find_chars(sc, sc->text.p + p.off, p.len, TOK_PRED_WHITESPACE, err)) ||
                (rc = tok_split_emit(sc, &p, false, TOK_SPLIT_REMOVED, out, err)))
                return rc;
            break;
        case TOK_PRE_PUNCTUATION:
            if ((rc = tok_find_chars(sc, sc->text.p + p.off, p.len, TOK_PRED_PUNCT, err)) ||
                (rc = tok_split_emit(sc, &p, false, st->behavior, out, err)))
                return rc;
            break;
        case TOK_PRE_BERT:
            if ((rc = tok_pre_bert(sc, &p, out, err)))
                return rc;
            break;
        case TOK_PRE_METASPACE:
            if ((rc = tok_pre_metaspace(st, sc, &p, out, err)))
                return rc;
            break;
        case TOK_PRE_BYTELEVEL:
            if ((rc = tok_pre_bytelevel(st, last, sc, p, out, err)))
                return rc;
            break;
        }
    }
    return STATUS_OK;
}

enum status tok_pretokenizer_apply(const struct tok_pretokenizer *pt, struct tok_scratch *sc, const char *s,
                                   size_t len, bool at_origin, int *which, struct err *err)
{
    sc->text.n = 0;
    if (!tok_buf_put(&sc->text, s, len))
        return NOMEM(err);
    int w = 0;
    sc->pcs[0].n = 0;
    if (len && !tok_pieces_push(&sc->pcs[0], 0, len, at_origin ? TOK_PIECE_ORIGIN : 0))
        return NOMEM(err);
    for (size_t i = 0; i < pt->n && sc->pcs[w].n; i++) {
        enum status st = tok_pre_step(&pt->steps[i], i + 1 == pt->n, sc, &sc->pcs[w], &sc->pcs[w ^ 1], err);
        if (st)
            return st;
        w ^= 1;
    }
    *which = w;
    return STATUS_OK;
}
