/* token_mask.h — which tokens keep a grammar alive: per-step vocabulary masks.
 *
 * struct token_vocab holds every id's bytes (what the id adds to the decoded text: byte-level
 * tokens mapped back to raw bytes, added tokens' content) in a byte trie, built once per
 * tokenizer. A mask is one walk of the trie from the grammar's state: a byte that cannot follow
 * cuts its whole subtree, so the cost follows the tokens that are nearly allowed, not the
 * vocabulary. Special tokens are never in the trie: the end-of-sequence ids are allowed exactly
 * where the grammar may end, the other special ids never.
 *
 * struct token_mask is one sequence's constraint: its matcher, the current mask (a bit an id), and
 * a small cache of masks by matcher state (inside a long string the state repeats token after
 * token). Owned by one thread at a time. The part of a mask above the stacks' common frame (a
 * string's interior, whatever encloses it) is also kept in the vocabulary's shared cache, by
 * grammar content and state, so requests with the same schema walk it once between them; that
 * cache has its own lock (masks of several rows are computed in parallel).
 *
 * defines: struct token_vocab, token_vocab_init(), token_vocab_free(), struct token_mask,
 *          token_mask_init(), token_mask_free(), token_mask_compute(), token_mask_apply(),
 *          token_mask_accept(), token_mask_done(), token_mask_allows(), TOKEN_MASK_CACHE
 */
#ifndef MOESERVE_ENGINE_TOKEN_MASK_H
#define MOESERVE_ENGINE_TOKEN_MASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/grammar.h"

struct tokenizer;

struct token_vocab {
    int vocab;                  /* ids 0..vocab-1 */
    int n_logits;               /* the model's logits a row (>= vocab: checkpoints pad their vocabulary past the
                                   tokenizer's ids); token_mask_apply masks the ids past vocab; 0: vocab */
    /* every id's bytes: bytes[off[id] .. off[id + 1]) */
    uint32_t *off;              /* (vocab + 1) owned */
    uint8_t *bytes;             /* (off[vocab]) owned */
    uint8_t *kind;              /* (vocab) 0: in the trie, 1: end-of-sequence, 2: never (other special, unknown, empty) */
    /* the trie in preorder: node i's children are i + 1, end[i + 1], ... up to end[i] */
    int32_t n_nodes;
    uint8_t *node_byte;         /* (n_nodes) the byte on the edge into the node (root: 0) */
    int32_t *node_end;          /* (n_nodes) one past the node's subtree */
    int32_t *node_tok;          /* (n_nodes) the first id whose bytes end here, -1: none */
    int32_t *node_parent;       /* (n_nodes) the node above (root: -1) */
    int32_t *tok_next;          /* (vocab) the next id with the same bytes, -1: none */
    int32_t *eos;               /* (n_eos) owned */
    int n_eos;
    int max_len;                /* longest token in bytes */
    struct token_mask_shared *shared; /* masks' parts shared by every request, owned (its own lock) */
};
/* From a loaded tokenizer (byte-level BPE, or any tokenizer whose tokens decode to fixed bytes);
 * eos_ids: the ids that end a sequence (the model's). STATUS_UNSUPPORTED: a decoder whose tokens'
 * bytes depend on their neighbours. */
enum status token_vocab_init(struct token_vocab *tv, const struct tokenizer *t, const int32_t *eos_ids, int n_eos,
                             struct err *err);
/* Safe on a zeroed struct. */
void token_vocab_free(struct token_vocab *tv);

enum { TOKEN_MASK_CACHE = 16 };

struct token_mask_entry;
struct token_mask_dfa;
struct token_mask {
    const struct token_vocab *tv; /* borrowed */
    struct grammar_matcher m;
    uint32_t *bits;             /* ((max(vocab, n_logits) + 31) / 32) the mask token_mask_compute made: bit id =
                                   allowed (ids past vocab: never) */
    int n_allowed;              /* ids set in bits */
    struct token_mask_entry *cache; /* (TOKEN_MASK_CACHE) masks by whole state, owned */
    struct token_mask_entry *tcache; /* (TOKEN_MASK_CACHE) by the state above its common frame, owned */
    int tcache_next;
    int32_t *exposed;           /* (cap_exposed) scratch: trie nodes where a truncated walk met the cut */
    int n_exposed, cap_exposed;
    int cache_next;             /* the entry replaced next (round robin) */
    struct token_mask_dfa *dfa; /* a walk's automaton of matcher states, owned */
    int32_t *key;               /* (key_cap) scratch for a state's key */
    size_t key_cap;
    uint64_t n_computed, n_cached; /* masks walked, masks taken from the cache */
    uint64_t n_trunc_cached;       /* walked masks whose part above the common frame came from a cache */
    uint64_t n_shared_cached;      /* ... from the vocabulary's shared cache */
};
/* A constraint to grammar g (a reference is taken) over tv's vocabulary. */
enum status token_mask_init(struct token_mask *tm, const struct token_vocab *tv, struct grammar *g, struct err *err);
/* Safe on a zeroed struct. */
void token_mask_free(struct token_mask *tm);
/* tm->bits for the current state. STATUS_INVALID when no id is allowed (the grammar cannot go on
 * with this vocabulary) or the matcher failed. */
enum status token_mask_compute(struct token_mask *tm, struct err *err);
/* logits[id] = -inf for every id tm->bits leaves out, and for the ids in [vocab, n_logits). */
void token_mask_apply(const struct token_mask *tm, float *logits);
static inline bool token_mask_allows(const struct token_mask *tm, int32_t id)
{
    return (tm->bits[id >> 5] >> (id & 31)) & 1u;
}
/* Moves the state past id's bytes (an end-of-sequence id: only where the grammar may end; it
 * moves nothing). STATUS_INVALID if the id does not keep the grammar alive. */
enum status token_mask_accept(struct token_mask *tm, int32_t id, struct err *err);
/* The grammar is complete and nothing can follow: generation should stop. */
bool token_mask_done(const struct token_mask *tm);

#endif
