/* tok_bytes.c — what one token id stands for, as bytes, on its own (for token masks).
 *
 * Grammar-constrained decoding checks each id's bytes against a grammar of the output text, so it
 * needs every id's contribution to the decoded bytes independently of its neighbours. That holds
 * for ByteLevel decoders (each char of a token maps back to one byte; added tokens whose chars
 * are outside the map keep their own UTF-8) and for Fuse (concatenation); Metaspace, Strip,
 * Replace and ByteFallback change text across token boundaries or need a run of tokens, so those
 * chains are refused rather than approximated.
 */
#include <stdlib.h>
#include <string.h>

#include "format/tok_internal.h"
#include "format/tokenizer.h"

enum status tokenizer_token_bytes(const struct tokenizer *t, int32_t id, char **out, size_t *len, size_t *cap,
                                  struct err *err)
{
    bool bytelevel = false;
    for (size_t i = 0; i < t->decoder.n; i++) {
        enum tok_dec_kind k = t->decoder.steps[i].kind;
        if (k == TOK_DEC_BYTELEVEL)
            bytelevel = true;
        else if (k != TOK_DEC_FUSE)
            return err_set(err, STATUS_UNSUPPORTED,
                           "%s: its decoder joins tokens with context (step %zu): token bytes are not fixed", t->name, i);
    }
    if (!t->decoder.present || !bytelevel)
        return err_set(err, STATUS_UNSUPPORTED, "%s: no ByteLevel decoder: token bytes are not fixed", t->name);
    size_t n = 0;
    const char *s = tok_id_text(t, id, &n);
    if (!s)
        return err_set(err, STATUS_INVALID, "%s: id %d is not in the vocabulary", t->name, (int)id);
    struct tok_buf b = {0};
    if (!tok_bytelevel_decode_token(s, n, &b)) {
        tok_buf_free(&b);
        return err_set(err, STATUS_NOMEM, "%s: out of memory", t->name);
    }
    if (*len + b.n + 1 > *cap) {
        size_t nc = *cap ? *cap : 1024;
        while (nc < *len + b.n + 1)
            nc *= 2;
        char *q = realloc(*out, nc);
        if (!q) {
            tok_buf_free(&b);
            return err_set(err, STATUS_NOMEM, "%s: out of memory", t->name);
        }
        *out = q, *cap = nc;
    }
    memcpy(*out + *len, b.p, b.n);
    *len += b.n;
    tok_buf_free(&b);
    return STATUS_OK;
}
