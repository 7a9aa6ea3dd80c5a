/* tok_post.c — post-processors, single sequence only (add_special_tokens).
 *
 * Every supported processor reduces to "ids before, the sequence, ids after":
 * ByteLevel (adds nothing), TemplateProcessing (`single` pieces: SpecialToken
 * ids from `special_tokens`, Sequence = the text), RobertaProcessing and
 * BertProcessing (cls ... sep), and Sequence of these (composed in order).
 * Not done: pairs, type ids, offsets.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/tok_internal.h"

static bool post_append(int32_t **v, size_t *n, const int32_t *ids, size_t k)
{
    if (!k)
        return true;
    int32_t *p = realloc(*v, (*n + k) * sizeof *p);
    if (!p)
        return false;
    memcpy(p + *n, ids, k * sizeof *p);
    *v = p;
    *n += k;
    return true;
}

/* Appends the ids of special_tokens[name] to pre or suf. */
static enum status post_special(struct tok_post *pp, bool before, const struct json *specials,
                                const char *name, const char *path, struct err *err)
{
    const struct json *sp = json_get(specials, name);
    const struct json *ids = json_get(sp, "ids");
    if (!json_is_array(ids))
        return err_set(err, STATUS_FORMAT, "%s.special_tokens: \"%.200s\" missing or without ids", path,
                       name);
    size_t i = 0;
    for (const struct json *e = json_child(ids); e; e = json_next(e), i++) {
        double d = json_number(e);
        if (!json_is_number(e) || !(d >= 0 && d < INT32_MAX) || d != (double)(int32_t)d)
            return err_set(err, STATUS_FORMAT, "%s.special_tokens[\"%.200s\"].ids[%zu]: expected an id", path,
                           name, i);
        int32_t id = (int32_t)d;
        if (!(before ? post_append(&pp->pre, &pp->n_pre, &id, 1) : post_append(&pp->suf, &pp->n_suf, &id, 1)))
            return err_set(err, STATUS_NOMEM, "%s: out of memory", path);
    }
    return STATUS_OK;
}

static enum status post_template(struct tok_post *pp, const struct json *j, const char *path, struct err *err)
{
    const struct json *single = json_get(j, "single");
    const struct json *specials = json_get(j, "special_tokens");
    if (!json_is_array(single))
        return err_set(err, STATUS_FORMAT, "%s.single: expected an array of pieces", path);
    int seen_seq = 0;
    size_t i = 0;
    enum status st;
    for (const struct json *e = json_child(single); e; e = json_next(e), i++) {
        const struct json *tok = json_get(e, "SpecialToken");
        const struct json *seq = json_get(e, "Sequence");
        if (tok) {
            const char *name;
            char p[512];
            snprintf(p, sizeof p, "%s.single[%zu].SpecialToken", path, i);
            if ((st = tok_json_str(tok, "id", p, true, &name, err)) ||
                (st = post_special(pp, !seen_seq, specials, name, path, err)))
                return st;
        } else if (seq) {
            const char *id = json_string(json_get(seq, "id"));
            if (!id || strcmp(id, "A"))
                return err_set(err, STATUS_UNSUPPORTED, "%s.single[%zu]: only sequence A is supported", path,
                               i);
            if (seen_seq++)
                return err_set(err, STATUS_UNSUPPORTED, "%s.single: sequence A twice is not supported", path);
        } else {
            return err_set(err, STATUS_FORMAT, "%s.single[%zu]: expected SpecialToken or Sequence", path, i);
        }
    }
    pp->drop_seq = !seen_seq;
    return STATUS_OK;
}

/* RobertaProcessing / BertProcessing: "cls": ["<s>", 0], "sep": ["</s>", 2]. */
static enum status post_cls_sep(struct tok_post *pp, const struct json *j, const char *path, struct err *err)
{
    const char *keys[2] = {"cls", "sep"};
    for (int k = 0; k < 2; k++) {
        const struct json *v = json_get(j, keys[k]);
        const struct json *idj = json_array_at(v, 1);
        double d = json_number(idj);
        if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_number(idj) ||
            !(d >= 0 && d < INT32_MAX) || d != (double)(int32_t)d)
            return err_set(err, STATUS_FORMAT, "%s.%s: expected [token, id]", path, keys[k]);
        int32_t id = (int32_t)d;
        if (!(k == 0 ? post_append(&pp->pre, &pp->n_pre, &id, 1) : post_append(&pp->suf, &pp->n_suf, &id, 1)))
            return err_set(err, STATUS_NOMEM, "%s: out of memory", path);
    }
    return STATUS_OK;
}

static enum status post_parse_one(struct tok_post *pp, const struct json *j, const char *path,
                                  struct err *err)
{
    if (!json_is_object(j))
        return err_set(err, STATUS_FORMAT, "%s: expected an object", path);
    const char *type;
    enum status st = tok_json_str(j, "type", path, true, &type, err);
    if (st)
        return st;
    if (!strcmp(type, "ByteLevel"))
        return STATUS_OK;
    if (!strcmp(type, "TemplateProcessing") || !strcmp(type, "RobertaProcessing") ||
        !strcmp(type, "BertProcessing")) {
        /* compose: this processor wraps what came before */
        struct tok_post inner = *pp, outer = {0};
        st = !strcmp(type, "TemplateProcessing") ? post_template(&outer, j, path, err)
                                                 : post_cls_sep(&outer, j, path, err);
        if (st) {
            tok_post_free(&outer);
            return st;
        }
        struct tok_post joined = {.drop_seq = inner.drop_seq || outer.drop_seq};
        bool ok = true;
        if (outer.drop_seq) { /* the earlier result is discarded */
            ok = post_append(&joined.pre, &joined.n_pre, outer.pre, outer.n_pre) &&
                 post_append(&joined.suf, &joined.n_suf, outer.suf, outer.n_suf);
        } else {
            ok = post_append(&joined.pre, &joined.n_pre, outer.pre, outer.n_pre) &&
                 post_append(&joined.pre, &joined.n_pre, inner.pre, inner.n_pre) &&
                 post_append(&joined.suf, &joined.n_suf, inner.suf, inner.n_suf) &&
                 post_append(&joined.suf, &joined.n_suf, outer.suf, outer.n_suf);
        }
        tok_post_free(&outer);
        tok_post_free(pp);
        *pp = joined;
        return ok ? STATUS_OK : err_set(err, STATUS_NOMEM, "%s: out of memory", path);
    }
    if (!strcmp(type, "Sequence")) {
        const struct json *list = json_get(j, "processors");
        if (!json_is_array(list))
            return err_set(err, STATUS_FORMAT, "%s.processors: expected an array", path);
        size_t i = 0;
        for (const struct json *e = json_child(list); e; e = json_next(e), i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            if ((st = post_parse_one(pp, e, sub, err)))
                return st;
        }
        return STATUS_OK;
    }
    return err_set(err, STATUS_UNSUPPORTED, "%s.type: post-processor \"%s\" is not supported", path, type);
}

enum status tok_post_parse(struct tok_post *pp, const struct json *j, const struct tokenizer *t,
                           const char *path, struct err *err)
{
    (void)t;
    return post_parse_one(pp, j, path, err);
}

void tok_post_free(struct tok_post *pp)
{
    free(pp->pre);
    free(pp->suf);
    memset(pp, 0, sizeof *pp);
}
