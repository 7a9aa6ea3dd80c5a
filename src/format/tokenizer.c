/* tokenizer.c — loading tokenizer.json, the encode pipeline, decode, queries.
 *
 * Encode follows Tokenizer::encode of HF tokenizers: (1) split the raw text
 * on added tokens with normalized == false; (2) normalize each remaining span
 * and split it on added tokens with normalized == true; (3) pre-tokenize each
 * span into pieces; (4) run the BPE model on each piece; (5) with
 * add_special_tokens, wrap the ids as the post-processor says.
 * Ids of added tokens are HF's: the model's id when the content is in the
 * model vocab, else the id from the file. Every id the tokenizer can emit is
 * < n_ids (post-processor ids are checked at load).
 * Not done: truncation/padding (ignored), offsets, pairs.
 */
#include "format/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "base/unicode.h"
#include "format/tok_internal.h"

void tok_scratch_free(struct tok_scratch *s)
{
    regex_scratch_free(&s->rx);
    tok_buf_free(&s->text);
    free(s->pcs[0].v);
    free(s->pcs[1].v);
    tok_buf_free(&s->norm[0]);
    tok_buf_free(&s->norm[1]);
    tok_buf_free(&s->word);
    free(s->sym);
    free(s->heap);
    free(s->segs[0].v);
    free(s->segs[1].v);
    free(s->found.v);
    free(s->parts.v);
    memset(s, 0, sizeof *s);
}

const char *tok_id_text(const struct tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids)
        return NULL;
    int32_t k = t->added.of_id ? t->added.of_id[id] : -1;
    if (k >= 0) {
        if (len)
            *len = t->added.tok[k].text_len;
        return t->added.tok[k].text;
    }
    return tok_strtab_text(&t->model.vocab, id, len);
}

/* ---- loading ---- */

static enum status tok_load_added(struct tokenizer *t, const struct json *list, const char *name,
                                  struct err *err)
{
    if (json_is_null(list))
        return STATUS_OK;
    if (!json_is_array(list))
        return err_set(err, STATUS_FORMAT, "%s: added_tokens: expected an array", name);
    size_t n = json_array_size(list);
    t->added.tok = calloc(n ? n : 1, sizeof *t->added.tok);
    if (!t->added.tok)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", name);
    size_t i = 0;
    enum status st;
    for (const struct json *e = json_child(list); e; e = json_next(e), i++) {
        char path[512];
        snprintf(path, sizeof path, "%s: added_tokens[%zu]", name, i);
        if (!json_is_object(e))
            return err_set(err, STATUS_FORMAT, "%s: expected an object", path);
        struct tok_added_token tk = {0};
        const char *content;
        size_t id;
        if ((st = tok_json_str(e, "content", path, true, &content, err)) ||
            (st = tok_json_uint(e, "id", path, (double)INT32_MAX - 2, 0, &id, err)) ||
            (st = tok_json_bool(e, "special", path, false, &tk.special, err)) ||
            (st = tok_json_bool(e, "single_word", path, false, &tk.single_word, err)) ||
            (st = tok_json_bool(e, "lstrip", path, false, &tk.lstrip, err)) ||
            (st = tok_json_bool(e, "rstrip", path, false, &tk.rstrip, err)) ||
            (st = tok_json_bool(e, "normalized", path, !tk.special, &tk.normalized, err)))
            return st;
        if (!json_get(e, "id"))
            return err_set(err, STATUS_FORMAT, "%s.id: missing", path);
        tk.len = strlen(content);
        if (tk.len == 0 || tok_strtab_get(&t->added.map, content, tk.len) >= 0)
            continue; /* HF ignores empty and repeated tokens */
        int32_t vid = tok_strtab_get(&t->model.vocab, content, tk.len);
        tk.id = vid >= 0 ? vid : (int32_t)id;
        if (!(tk.content = tok_strdup_n(content, tk.len)))
            return err_set(err, STATUS_NOMEM, "%s: out of memory", name);
        tk.text = tk.content;
        tk.text_len = tk.len;
        t->added.tok[t->added.n++] = tk;
        if ((st = tok_strtab_put(&t->added.map, content, tk.len, tk.id, err)))
            return st;
    }
    if ((size_t)t->added.map.n_ids > TOK_MAX_ID(t->model.vocab.n_ent + t->added.n))
        return err_set(err, STATUS_FORMAT, "%s: added_tokens: ids up to %d for %zu tokens (too sparse)", name,
                       (int)t->added.map.n_ids - 1, t->model.vocab.n_ent + t->added.n);
    return tok_strtab_index(&t->added.map, err);
}

static enum status tok_check_post_ids(const struct tokenizer *t, struct err *err)
{
    for (int k = 0; k < 2; k++) {
        const int32_t *v = k ? t->post.suf : t->post.pre;
        size_t n = k ? t->post.n_suf : t->post.n_pre;
        for (size_t i = 0; i < n; i++)
            if (!tok_id_text(t, v[i], NULL))
                return err_set(err, STATUS_FORMAT, "%s: post_processor: id %d is not in the vocabulary",
                               t->name, (int)v[i]);
    }
    return STATUS_OK;
}

static enum status tok_build(struct tokenizer *t, const struct json *root, struct err *err)
{
    const char *name = t->name;
    char path[512];
    if (!json_is_object(root))
        return err_set(err, STATUS_FORMAT, "%s: expected a JSON object", name);
    enum status st;
    const struct json *model = json_get(root, "model");
    snprintf(path, sizeof path, "%s: model", name);
    if (!model)
        return err_set(err, STATUS_FORMAT, "%s: missing", path);
    if ((st = tok_bpe_parse(&t->model, model, path, err)))
        return st;
    snprintf(path, sizeof path, "%s: normalizer", name);
    if ((st = tok_normalizer_parse(&t->normalizer, json_get(root, "normalizer"), path, err)))
        return st;
    snprintf(path, sizeof path, "%s: pre_tokenizer", name);
    if ((st = tok_pretokenizer_parse(&t->pretokenizer, json_get(root, "pre_tokenizer"), path, err)))
        return st;
    if ((st = tok_load_added(t, json_get(root, "added_tokens"), name, err)))
        return st;
    t->n_ids = t->model.vocab.n_ids > t->added.map.n_ids ? t->model.vocab.n_ids : t->added.map.n_ids;
    if ((st = tok_added_build(&t->added, &t->normalizer, err))) {
        err_prefix(err, "%s", name);
        return st;
    }
    size_t n_ids = t->n_ids ? (size_t)t->n_ids : 1;
    t->special = calloc(n_ids, 1);
    t->added.of_id = malloc(n_ids * sizeof *t->added.of_id);
    if (!t->special || !t->added.of_id)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", name);
    for (size_t i = 0; i < n_ids; i++)
        t->added.of_id[i] = -1;
    struct tok_strtab specials = {0};
    for (size_t i = 0; i < t->added.n && !st; i++) {
        const struct tok_added_token *tk = &t->added.tok[i];
        if (t->added.of_id[tk->id] < 0)
            t->added.of_id[tk->id] = (int32_t)i;
        if (tk->special)
            st = tok_strtab_put(&specials, tk->content, tk->len, 0, err);
    }
    /* HF skips by text: any id whose decode text is a special token's content */
    for (int32_t id = 0; id < t->n_ids && specials.n_ent && !st; id++) {
        size_t len;
        const char *s = tok_id_text(t, id, &len);
        t->special[id] = s && tok_strtab_get(&specials, s, len) >= 0;
    }
    tok_strtab_free(&specials);
    if (st)
        return st;
    const struct json *post = json_get(root, "post_processor");
    if (!json_is_null(post)) {
        snprintf(path, sizeof path, "%s: post_processor", name);
        t->has_post = true;
        if ((st = tok_post_parse(&t->post, post, t, path, err)) || (st = tok_check_post_ids(t, err)))
            return st;
    }
    snprintf(path, sizeof path, "%s: decoder", name);
    if ((st = tok_decoder_parse(&t->decoder, json_get(root, "decoder"), path, err)))
        return st;
    if (!json_is_null(json_get(root, "truncation")) || !json_is_null(json_get(root, "padding")))
        LOG_DEBUG("%s: truncation/padding settings ignored", name);
    return STATUS_OK;
}

enum status tokenizer_load_buffer(struct tokenizer **out, const char *json, size_t len, const char *name,
                                  struct err *err)
{
    *out = NULL;
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->name = tok_strdup_n(name, strlen(name)))) {
        free(t);
        return err_set(err, STATUS_NOMEM, "%s: out of memory", name);
    }
    struct json *root = NULL;
    enum status st = json_parse(json, len, name, &root, err);
    if (!st)
        st = tok_build(t, root, err);
    json_free(root);
    if (st) {
        /* every load error names the file */
        if (err && strncmp(err->msg, name, strlen(name)) != 0)
            err_prefix(err, "%s", name);
        tokenizer_free(t);
        return st;
    }
    *out = t;
    return STATUS_OK;
}

enum status tokenizer_load(struct tokenizer **out, const char *path, struct err *err)
{
    *out = NULL;
    struct mapped_file mf = {0};
    enum status st = mapped_file_open(&mf, path, err);
    if (st)
        return st;
    st = tokenizer_load_buffer(out, mf.data ? mf.data : "", mf.size, path, err);
    mapped_file_close(&mf);
    return st;
}

void tokenizer_free(struct tokenizer *t)
{
    if (!t)
        return;
    tok_normalizer_free(&t->normalizer);
    tok_pretokenizer_free(&t->pretokenizer);
    tok_bpe_free(&t->model);
    tok_added_free(&t->added);
    tok_post_free(&t->post);
    tok_decoder_free(&t->decoder);
    free(t->special);
    free(t->name);
    free(t);
}

/* ---- encode ---- */

#define NOMEM(err) err_set(err, STATUS_NOMEM, "tokenizer: out of memory")

static enum status tok_encode_span(const struct tokenizer *t, struct tok_scratch *sc, const char *s,
                                   size_t len, bool at_origin, struct tok_ids *out, struct err *err)
{
    int which;
    enum status st = tok_pretokenizer_apply(&t->pretokenizer, sc, s, len, at_origin, &which, err);
    if (st)
        return st;
    const struct tok_pieces *pcs = &sc->pcs[which];
    for (size_t i = 0; i < pcs->n; i++) {
        const struct tok_piece *p = &pcs->v[i];
        if ((st = tok_bpe_tokenize(&t->model, sc, sc->text.p + p->off, p->len, p->flags & TOK_PIECE_BYTES,
                                   out, err)))
            return st;
    }
    return STATUS_OK;
}

static enum status tok_encode_text(const struct tokenizer *t, struct tok_scratch *sc, const char *text,
                                   size_t len, struct tok_ids *out, struct err *err)
{
    enum status st = tok_added_split(&t->added, 0, sc, text, len, err);
    if (st)
        return st;
    for (size_t i = 0; i < sc->segs[0].n; i++) {
        const struct tok_match seg = sc->segs[0].v[i];
        if (seg.id >= 0) {
            if (!tok_ids_push(out, seg.id))
                return NOMEM(err);
            continue;
        }
        const char *ns;
        size_t nn;
        if ((st = tok_normalizer_apply(&t->normalizer, sc, text + seg.start, seg.end - seg.start, &ns, &nn,
                                       err)) ||
            (st = tok_added_split(&t->added, 1, sc, ns, nn, err)))
            return st;
        for (size_t j = 0; j < sc->segs[1].n; j++) {
            const struct tok_match sub = sc->segs[1].v[j];
            if (sub.id >= 0) {
                if (!tok_ids_push(out, sub.id))
                    return NOMEM(err);
                continue;
            }
            if ((st = tok_encode_span(t, sc, ns + sub.start, sub.end - sub.start,
                                      seg.start == 0 && sub.start == 0, out, err)))
                return st;
        }
    }
    return STATUS_OK;
}

enum status tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special_tokens,
                             struct tok_ids *out, struct err *err)
{
    size_t bad;
    if (!text && len)
        return err_set(err, STATUS_INVALID, "%s: encode: NULL text", t->name);
    if (len && !unicode_utf8_validate(text, len, &bad))
        return err_set(err, STATUS_INVALID, "%s: encode: text is not valid UTF-8 at byte %zu", t->name, bad);
    size_t mark = out->n;
    bool wrap = add_special_tokens && t->has_post;
    struct tok_scratch sc = {0};
    enum status st = STATUS_OK;
    for (size_t i = 0; wrap && i < t->post.n_pre && !st; i++)
        if (!tok_ids_push(out, t->post.pre[i]))
            st = NOMEM(err);
    if (!st && !(wrap && t->post.drop_seq) && len)
        st = tok_encode_text(t, &sc, text, len, out, err);
    for (size_t i = 0; wrap && i < t->post.n_suf && !st; i++)
        if (!tok_ids_push(out, t->post.suf[i]))
            st = NOMEM(err);
    tok_scratch_free(&sc);
    if (st)
        out->n = mark;
    return st;
}

/* ---- decode and queries ---- */

enum status tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n,
                             bool skip_special_tokens, char **out, size_t *out_len, struct err *err)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    const char **tok = malloc((n ? n : 1) * sizeof *tok);
    size_t *tok_len = malloc((n ? n : 1) * sizeof *tok_len);
    if (!tok || !tok_len) {
        free(tok);
        free(tok_len);
        return NOMEM(err);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = tok_id_text(t, ids[i], &tok_len[k]);
        if (!s) {
            free(tok);
            free(tok_len);
            return err_set(err, STATUS_INVALID,
                           "%s: decode: ids[%zu] = %d is not in the vocabulary (size %d)", t->name, i,
                           (int)ids[i], (int)t->n_ids);
        }
        if (skip_special_tokens && t->special[ids[i]])
            continue;
        tok[k++] = s;
    }
    struct tok_buf b = {0};
    enum status st = tok_decoder_run(&t->decoder, tok, tok_len, k, &b, err);
    free(tok);
    free(tok_len);
    if (st) {
        tok_buf_free(&b);
        return st;
    }
    *out = b.p;
    if (out_len)
        *out_len = b.n;
    return STATUS_OK;
}

bool tokenizer_id_known(const struct tokenizer *t, int32_t id)
{
    size_t len;
    return tok_id_text(t, id, &len) != NULL;
}

int tokenizer_vocab_size(const struct tokenizer *t)
{
    return t->n_ids;
}

int32_t tokenizer_token_id(const struct tokenizer *t, const char *token)
{
    size_t n = strlen(token);
    int32_t id = tok_strtab_get(&t->added.map, token, n);
    return id >= 0 ? id : tok_strtab_get(&t->model.vocab, token, n);
}

const char *tokenizer_token_text(const struct tokenizer *t, int32_t id)
{
    return tok_id_text(t, id, NULL);
}

bool tokenizer_is_special(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->special[id];
}
