/* tok_internal.h — what the tokenizer's parts share; not an API (see tokenizer.h).
 *
 * The tokenizer is split by concern, mirroring Hugging Face `tokenizers`:
 *   tokenizer.c       loading tokenizer.json, the encode pipeline, queries
 *   tok_vocab.c       string <-> id tables, growable buffers, JSON field helpers
 *   tok_added.c       added tokens: the two tries (raw, normalized) and the split
 *   tok_normalize.c   normalizers
 *   tok_pretokenize.c pre-tokenizers (splitting into pieces)
 *   tok_bpe.c         the BPE model
 *   tok_post.c        post-processors (add_special_tokens)
 *   tok_decode.c      decoders (ids -> text)
 *   tok_detok.c       the streaming detokenizer
 * Everything built at load is immutable afterwards; per-call state lives in a
 * struct tok_scratch owned by the calling thread.
 */
#ifndef MOESERVE_FORMAT_TOK_INTERNAL_H
#define MOESERVE_FORMAT_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/json.h"
#include "base/regex.h"
#include "base/status.h"
#include "format/tokenizer.h"

/* ---- growable buffers -------------------------------------------------- */

struct tok_buf {
    char *p; /* (cap) owned; p[n] == 0 after tok_buf_put */
    size_t n, cap;
};
bool tok_buf_reserve(struct tok_buf *b, size_t extra);
bool tok_buf_put(struct tok_buf *b, const void *s, size_t n);
void tok_buf_free(struct tok_buf *b);

bool tok_ids_push(struct tok_ids *ids, int32_t id);

/* ---- string <-> id table (open addressing) ------------------------------ */

struct tok_entry {
    uint32_t off, len; /* token text at text + off, NUL-terminated */
    int32_t id;
};

struct tok_strtab {
    char *text; /* (text_n) all token strings, each NUL-terminated; owned */
    size_t text_n, text_cap;
    struct tok_entry *ent; /* (n_ent) owned */
    size_t n_ent, cap_ent;
    uint32_t *slot; /* (mask + 1) entry index + 1, 0 = empty; owned */
    size_t mask;
    int32_t *by_id; /* (n_ids) entry index or -1; built by tok_strtab_index */
    int32_t n_ids;  /* max id + 1 */
};
/* Inserts s -> id; an existing s gets the new id (JSON maps: last key wins). */
enum status tok_strtab_put(struct tok_strtab *t, const char *s, size_t len, int32_t id, struct err *err);
/* Builds by_id; the first string seen for an id wins. */
enum status tok_strtab_index(struct tok_strtab *t, struct err *err);
int32_t tok_strtab_get(const struct tok_strtab *t, const char *s, size_t len);    /* -1 if absent */
const char *tok_strtab_text(const struct tok_strtab *t, int32_t id, size_t *len); /* NULL if absent */
void tok_strtab_free(struct tok_strtab *t);

/* Ids must be dense enough that id-indexed tables stay proportional to the
 * vocabulary (a hostile file could name id 2^31 - 2): max id < this. */
#define TOK_MAX_ID(n_tokens) ((size_t)(n_tokens)*8 + 65536)

/* ---- JSON field helpers: errors name `path.key` ------------------------- */

/* A string member (NULL when absent/null and !required); validated UTF-8. */
enum status tok_json_str(const struct json *obj, const char *key, const char *path, bool required,
                         const char **out, struct err *err);
enum status tok_json_bool(const struct json *obj, const char *key, const char *path, bool dflt, bool *out,
                          struct err *err);
/* A non-negative integer member <= max. */
enum status tok_json_uint(const struct json *obj, const char *key, const char *path, double max, size_t dflt,
                          size_t *out, struct err *err);
/* A string that must be valid UTF-8 (json strings may carry raw bad bytes). */
enum status tok_json_check_utf8(const char *s, const char *path, struct err *err);
char *tok_strdup_n(const char *s, size_t n);

/* ---- per-call scratch --------------------------------------------------- */

#define TOK_PIECE_ORIGIN 1u /* starts at offset 0 of the original text */
#define TOK_PIECE_BYTES 2u  /* text is raw bytes standing for their ByteLevel chars */

struct tok_piece {
    size_t off, len; /* into tok_scratch.text */
    unsigned flags;
};

struct tok_pieces {
    struct tok_piece *v; /* (cap) owned */
    size_t n, cap;
};
bool tok_pieces_push(struct tok_pieces *p, size_t off, size_t len, unsigned flags);

/* A span of text: an added token (id >= 0), plain text or a pattern match (id < 0). */
struct tok_match {
    size_t start, end;
    int32_t id;
};
struct tok_spans {
    struct tok_match *v; /* (cap) owned */
    size_t n, cap;
};
bool tok_spans_push(struct tok_spans *sp, size_t start, size_t end, int32_t id);

struct bpe_sym;
struct bpe_merge;

struct tok_scratch {
    struct regex_scratch rx;
    struct tok_buf text;      /* pre-tokenizer working text; pieces index into it */
    struct tok_pieces pcs[2]; /* ping-pong piece lists */
    struct tok_buf norm[2];   /* normalizer ping-pong */
    struct tok_buf word;      /* BPE: a piece mapped to its ByteLevel chars */
    struct bpe_sym *sym;      /* (cap_sym) BPE symbols */
    size_t cap_sym;
    struct bpe_merge *heap; /* (cap_heap) BPE merge queue */
    size_t cap_heap;
    struct tok_spans segs[2]; /* added-token splits (raw, normalized) */
    struct tok_spans found;   /* pattern matches of one pre-tokenizer/normalizer step */
    struct tok_spans parts;   /* a piece cut by those matches (id = 1 for a match) */
};
void tok_scratch_free(struct tok_scratch *s);

/* ---- ByteLevel tables (GPT-2 bytes_to_unicode) -------------------------- */

uint32_t tok_bytelevel_char(unsigned char b);
/* The byte a ByteLevel char stands for, or -1. */
int tok_bytelevel_byte(uint32_t cp);

/* ---- normalizers -------------------------------------------------------- */

enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_REPLACE,
    TOK_NORM_PREPEND,
    TOK_NORM_STRIP,
    TOK_NORM_BYTELEVEL,
};

struct tok_norm {
    enum tok_norm_kind kind;
    char *pattern; /* REPLACE literal (owned), or NULL with re */
    size_t pattern_len;
    struct regex *re; /* REPLACE regex, owned */
    char *content;    /* REPLACE replacement / PREPEND text, owned */
    size_t content_len;
    bool left, right; /* STRIP */
};

struct tok_normalizer {
    struct tok_norm *steps; /* (n) owned; n == 0: identity */
    size_t n;
};
enum status tok_normalizer_parse(struct tok_normalizer *nz, const struct json *j, const char *path,
                                 struct err *err);
/* Normalises s into one of scratch->norm; *out points at the result (or at s
 * when nothing changed). */
enum status tok_normalizer_apply(const struct tok_normalizer *nz, struct tok_scratch *sc, const char *s,
                                 size_t len, const char **out, size_t *out_len, struct err *err);
void tok_normalizer_free(struct tok_normalizer *nz);

/* ---- pre-tokenizers ----------------------------------------------------- */

enum tok_pre_kind {
    TOK_PRE_SPLIT,
    TOK_PRE_BYTELEVEL,
    TOK_PRE_DIGITS,
    TOK_PRE_METASPACE,
    TOK_PRE_WHITESPACE,
    TOK_PRE_WHITESPACE_SPLIT,
    TOK_PRE_PUNCTUATION,
    TOK_PRE_BERT,
};

enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};

enum tok_prepend { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

struct tok_pre {
    enum tok_pre_kind kind;
    struct regex *re; /* SPLIT regex / BYTELEVEL GPT-2 / WHITESPACE; owned */
    char *literal;    /* SPLIT String pattern, owned */
    size_t literal_len;
    enum tok_split_behavior behavior;
    bool invert;           /* SPLIT */
    bool add_prefix_space; /* BYTELEVEL */
    bool individual;       /* DIGITS */
    uint32_t replacement;  /* METASPACE */
    enum tok_prepend prepend;
    bool split;
};

struct tok_pretokenizer {
    struct tok_pre *steps; /* (n) owned; n == 0: one piece per segment */
    size_t n;
};
enum status tok_pretokenizer_parse(struct tok_pretokenizer *pt, const struct json *j, const char *path,
                                   struct err *err);
/* Splits s into sc->pcs[*which] (pieces index sc->text). */
enum status tok_pretokenizer_apply(const struct tok_pretokenizer *pt, struct tok_scratch *sc, const char *s,
                                   size_t len, bool at_origin, int *which, struct err *err);
void tok_pretokenizer_free(struct tok_pretokenizer *pt);
/* A {"String": s} or {"Regex": r} pattern: *lit (owned copy) or *re. */
enum status tok_pattern_parse(const struct json *pat, const char *path, char **lit, size_t *lit_len,
                              struct regex **re, struct err *err);
/* A "Replace" step (normalizer or decoder): its pattern and owned content copy.
 * On failure nothing is left allocated. */
enum status tok_replace_parse(const struct json *j, const char *path, char **pattern, size_t *pattern_len,
                              struct regex **re, char **content, size_t *content_len, struct err *err);
/* A "Sequence" step: calls parse(ctx, element, "path.key[i]") for every element of j[key]. */
typedef enum status (*tok_parse_fn)(void *ctx, const struct json *j, const char *path, struct err *err);
enum status tok_sequence_parse(void *ctx, const struct json *j, const char *key, const char *path, tok_parse_fn parse,
                               struct err *err);
/* All matches of a regex (Oniguruma find_iter rules for empty matches) or of a
 * literal (non-overlapping, left to right; "" never matches) into *out. */
enum status tok_find_all(const struct regex *re, const char *lit, size_t lit_len, struct regex_scratch *rx,
                         const char *s, size_t len, struct tok_spans *out, struct err *err);

/* ---- BPE model ---------------------------------------------------------- */

/* One merge: key = id_a << 32 | id_b (UINT64_MAX = empty slot); one cache line holds 4. */
struct tok_merge_slot {
    uint64_t key;
    uint32_t rank;  /* index in model.merges */
    int32_t new_id; /* id of the merged token */
};

#define TOK_CHAR_TABLE 2048 /* direct id table for one-char tokens below this code point */

struct tok_bpe {
    struct tok_strtab vocab;
    struct tok_merge_slot *merges; /* (merge_mask + 1) open addressing; owned */
    size_t merge_mask;
    size_t n_merges;
    int32_t unk_id; /* -1: no unk_token */
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix / end_of_word_suffix; NULL if absent or "" */
    size_t prefix_len, suffix_len;
    int32_t fallback_ids[256];  /* "<0xXX>" ids, -1 absent */
    int32_t bytelevel_ids[256]; /* id of the one-char token of byte b's ByteLevel char */
    int32_t *char_ids;          /* (TOK_CHAR_TABLE) id of the one-char token of cp, -1 absent */
};
enum status tok_bpe_parse(struct tok_bpe *m, const struct json *j, const char *path, struct err *err);
/* Appends the ids of one piece (text, or raw bytes when `bytes`). */
enum status tok_bpe_tokenize(const struct tok_bpe *m, struct tok_scratch *sc, const char *s, size_t len,
                             bool bytes, struct tok_ids *out, struct err *err);
void tok_bpe_free(struct tok_bpe *m);

/* ---- added tokens ------------------------------------------------------- */

struct tok_added_token {
    char *content; /* owned */
    size_t len;
    char *text; /* what decoding shows: the normalized content when normalized (HF's
                 * normalized_cache), else content; owned or == content */
    size_t text_len;
    int32_t id;
    bool special, single_word, lstrip, rstrip, normalized;
};

struct tok_trie_node;

struct tok_trie {
    struct tok_trie_node *nodes; /* (n_nodes) owned; node 0 = root */
    size_t n_nodes, cap_nodes;
    int32_t root_next[256]; /* child of the root per byte, -1 none */
    size_t n_patterns;
};

struct tok_added {
    struct tok_added_token *tok; /* (n) owned, in HF order: special first, then the others */
    size_t n;
    struct tok_strtab map;   /* content -> id */
    int32_t *of_id;          /* (n_ids of the tokenizer) token index of an id, -1 none */
    struct tok_trie trie[2]; /* [0] normalized == false (raw text), [1] normalized == true */
};

enum status tok_added_build(struct tok_added *a, const struct tok_normalizer *nz, struct err *err);
/* Splits s like AddedVocabulary::find_matches with trie `which` into sc->segs[which]. */
enum status tok_added_split(const struct tok_added *a, int which, struct tok_scratch *sc, const char *s,
                            size_t len, struct err *err);
void tok_added_free(struct tok_added *a);

/* ---- post-processor (single sequence) ----------------------------------- */

struct tok_post {
    int32_t *pre, *suf; /* (n_pre), (n_suf) ids around the sequence; owned */
    size_t n_pre, n_suf;
    bool drop_seq; /* a template without $A */
};
enum status tok_post_parse(struct tok_post *pp, const struct json *j, const struct tokenizer *t,
                           const char *path, struct err *err);
void tok_post_free(struct tok_post *pp);

/* ---- decoders ----------------------------------------------------------- */

enum tok_dec_kind {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_REPLACE,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_METASPACE,
};

struct tok_dec {
    enum tok_dec_kind kind;
    char *pattern; /* REPLACE literal, owned (NULL with re) */
    size_t pattern_len;
    struct regex *re; /* REPLACE regex, owned */
    char *content;    /* REPLACE replacement, owned */
    size_t content_len;
    uint32_t ch;        /* STRIP content / METASPACE replacement */
    size_t start, stop; /* STRIP */
    bool prepend;       /* METASPACE: prepend_scheme != never */
};

struct tok_decoder {
    struct tok_dec *steps; /* (n) owned */
    size_t n;
    bool present; /* false: tokens are joined with " " */
};
enum status tok_decoder_parse(struct tok_decoder *d, const struct json *j, const char *path, struct err *err);
void tok_decoder_free(struct tok_decoder *d);
/* Runs the decoder chain on token strings (list of spans in `in`). */
enum status tok_decoder_run(const struct tok_decoder *d, const char *const *tok, const size_t *tok_len,
                            size_t n, struct tok_buf *out, struct err *err);
/* ByteFallback's "<0xXX>" -> the byte, or -1 (u8::from_str_radix also takes '+'). */
int tok_fallback_byte(const char *s, size_t n);
/* HF ByteLevel decoding of one token: its bytes (appended to out). */
bool tok_bytelevel_decode_token(const char *s, size_t len, struct tok_buf *out);

/* ---- the tokenizer ------------------------------------------------------ */

struct tokenizer {
    char *name; /* file name for messages, owned */
    struct tok_normalizer normalizer;
    struct tok_pretokenizer pretokenizer;
    struct tok_bpe model;
    struct tok_added added;
    struct tok_post post;
    bool has_post;
    struct tok_decoder decoder;
    int32_t n_ids;    /* max id + 1 over model and added tokens */
    uint8_t *special; /* (n_ids) 1 if the id's decode text is the content of a special added token */
};

/* Text of id as HF's id_to_token: added tokens first (their normalized form
 * when normalized), then the model. */
const char *tok_id_text(const struct tokenizer *t, int32_t id, size_t *len);

#endif
