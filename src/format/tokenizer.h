/* tokenizer.h — Hugging Face `tokenizers`-compatible tokenizer (tokenizer.json).
 *
 * Loads a tokenizer.json and encodes text to exactly the ids of
 * `Tokenizer.encode(text, add_special_tokens=...)` from HF tokenizers, and
 * decodes ids like `Tokenizer.decode(ids, skip_special_tokens=...)`.
 * Pipeline (as in HF): added tokens are split off the raw text; the rest is
 * normalized, split again on `normalized` added tokens, pre-tokenized into
 * pieces, and each piece goes through the BPE model; the post-processor adds
 * special tokens when asked.
 * Supported: normalizers NFC/NFD/NFKC/NFKD/Lowercase/Replace/Prepend/Strip/ByteLevel/
 * Sequence; pre-tokenizers Split/ByteLevel/Digits/Metaspace/Whitespace/
 * WhitespaceSplit/Punctuation/BertPreTokenizer/Sequence; model BPE (merges in
 * both JSON forms, ignore_merges, byte_fallback, unk_token/fuse_unk, subword
 * prefix/suffix); post-processors ByteLevel/TemplateProcessing/Roberta/Bert/
 * Sequence; decoders ByteLevel/Replace/ByteFallback/Fuse/Strip/Metaspace/
 * Sequence. Anything else is refused at load with STATUS_UNSUPPORTED naming
 * the type and its JSON path.
 * Not done: offsets, truncation/padding (ignored), pairs of sequences,
 * BPE dropout (ignored: encoding stays deterministic), WordPiece/Unigram.
 *
 * Thread safety: a loaded tokenizer is immutable; encode/decode may run on
 * many threads at once (all scratch memory is per call).
 *
 * defines: struct tokenizer, tokenizer_load(), tokenizer_load_buffer(),
 *          tokenizer_free(), struct tok_ids, tok_ids_free(), tokenizer_encode(),
 *          tokenizer_decode(), tokenizer_vocab_size(), tokenizer_id_known(), tokenizer_token_id(),
 *          tokenizer_token_text(), tokenizer_is_special(), tokenizer_token_bytes(), struct detok_stream,
 *          detok_stream_init(), detok_stream_push(), detok_stream_flush(),
 *          detok_stream_free()
 */
#ifndef MOESERVE_FORMAT_TOKENIZER_H
#define MOESERVE_FORMAT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

struct tokenizer;

enum status tokenizer_load(struct tokenizer **out, const char *path_of_tokenizer_json, struct err *err);
/* Same from a JSON text in memory; `name` is used in error messages. */
enum status tokenizer_load_buffer(struct tokenizer **out, const char *json, size_t len, const char *name,
                                  struct err *err);
void tokenizer_free(struct tokenizer *t);

struct tok_ids {
    int32_t *ids; /* (cap) malloc'ed; n used */
    size_t n, cap;
};
/* Frees ids and zeroes the struct (safe on a zeroed struct). */
void tok_ids_free(struct tok_ids *ids);

/* Appends the ids of text[0..len) to *out (which may hold earlier ids).
 * Invalid UTF-8 is STATUS_INVALID naming the byte offset; *out is then
 * left as it was. */
enum status tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special_tokens,
                             struct tok_ids *out, struct err *err);

/* Decodes ids into a malloc'ed, NUL-terminated *out (*out_len bytes without the
 * NUL). Invalid UTF-8 produced by byte tokens becomes U+FFFD as in HF. An id
 * outside the vocabulary is STATUS_INVALID. */
enum status tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n,
                             bool skip_special_tokens, char **out, size_t *out_len, struct err *err);

int tokenizer_vocab_size(const struct tokenizer *t);                      /* max id + 1 */
bool tokenizer_id_known(const struct tokenizer *t, int32_t id);           /* id has a token */
int32_t tokenizer_token_id(const struct tokenizer *t, const char *token); /* -1 if absent */
/* Text of id as HF's id_to_token (an added token with normalized: true shows
 * its normalized form, as decode does); NULL if absent. */
const char *tokenizer_token_text(const struct tokenizer *t, int32_t id);
/* True if decode with skip_special_tokens drops id (its text is a special added token's). */
bool tokenizer_is_special(const struct tokenizer *t, int32_t id);
/* The bytes id stands for on its own (tok_bytes.c): a ByteLevel token's raw bytes (possibly part
 * of a UTF-8 character), appended to *out (realloc'ed, *len updated). STATUS_UNSUPPORTED when the
 * decoder makes a token's bytes depend on its neighbours (any step but ByteLevel and Fuse). */
enum status tokenizer_token_bytes(const struct tokenizer *t, int32_t id, char **out, size_t *len, size_t *cap,
                                  struct err *err);

/* Streaming detokenizer for generation. Pieces are whole UTF-8 characters
 * only; the concatenation of everything push and flush return equals
 * tokenizer_decode() of all pushed ids. One stream per sequence; not shared
 * between threads. */
struct detok_impl;
struct detok_stream {
    const struct tokenizer *tok; /* borrowed */
    bool skip_special;
    struct detok_impl *impl; /* owned, created by the first push */
};
void detok_stream_init(struct detok_stream *s, const struct tokenizer *t, bool skip_special);
/* Feeds one id; writes up to cap bytes of newly final text to out (*n_out may
 * be 0). Text that does not fit (cap >= 4 is required) is kept and returned
 * by later pushes or flushes. An id outside the vocabulary is STATUS_INVALID
 * and leaves the stream unchanged. */
enum status detok_stream_push(struct detok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out,
                              struct err *err);
/* Ends the stream: returns the held-back rest (partial UTF-8 becomes U+FFFD,
 * as in decode). Call until *n_out == 0 when cap may be small. */
enum status detok_stream_flush(struct detok_stream *s, char *out, size_t cap, size_t *n_out, struct err *err);
/* Safe on a zeroed or initialised stream; the stream can be re-initialised. */
void detok_stream_free(struct detok_stream *s);

#endif
