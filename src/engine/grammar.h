/* grammar.h — context-free grammars over bytes, and their matcher, for constrained decoding.
 *
 * A grammar is data: rules, each a list of alternatives, each a sequence of elements; an element
 * is a byte class (a set of the 256 byte values) or a reference to a rule. Literals are runs of
 * one-byte classes; repetition is expanded by the builder into right-recursive helper rules
 * (gram_repeat), so the matcher knows only sequences, alternatives and references. Text is bytes:
 * UTF-8 is spelled out by the grammar's author (grammar_json.c writes its character classes as
 * UTF-8 byte sequences), which is what lets a tokenizer's byte-level tokens be checked piecewise.
 *
 * The matcher is a pushdown automaton run on a set of stacks (every way the input read so far can
 * continue), advanced one byte at a time: no backtracking, no recursive descent over the input.
 * A stack is a chain of frames (the top: the byte class to match next; below it: where each
 * enclosing rule resumes), stored as nodes (position, parent) that stacks share. A rule whose
 * reference ends its alternative is entered without a return frame, so right recursion (every
 * repetition) runs in constant stack depth. Left recursion (a rule reachable from itself without
 * reading a byte) is refused when the grammar is finished, so expanding a state always ends.
 *
 * Bounds: a grammar has at most GRAMMAR_MAX_ELEMS elements and GRAMMAR_MAX_RULES rules (the
 * builder fails past them: a request's schema that large is refused, not compiled); a matcher
 * holds at most GRAMMAR_MAX_STACKS stacks at once (more: an ambiguous grammar) of at most
 * GRAMMAR_MAX_DEPTH frames (more: output nested that deep through a recursive rule); past either
 * the byte is refused with the matcher marked failed, never a silent truncation.
 *
 * Not here: JSON Schema (grammar_json.c), the vocabulary and token masks (token_mask.c).
 * A finished grammar is immutable and reference-counted: any thread may match it.
 *
 * defines: GRAMMAR_MAX_ELEMS, GRAMMAR_MAX_RULES, GRAMMAR_MAX_STACKS, GRAMMAR_MAX_DEPTH, struct gram_class,
 *          gram_class_range(), gram_class_has(), struct gram_builder, gram_builder_init(), gram_builder_free(),
 *          gram_rule(), gram_alt(), gram_push_bytes(), gram_push_class(), gram_push_ref(), gram_rule_bytes(),
 *          gram_repeat(), gram_builder_finish(), struct grammar, grammar_ref(), grammar_put(), grammar_n_rules(),
 *          grammar_n_elems(), grammar_prefix(), grammar_fingerprint(), grammar_same(), GM_BOUNDARY,
 *          struct gm_node, struct gm_state, struct grammar_matcher, grammar_matcher_init(),
 *          grammar_matcher_free(), grammar_matcher_accept_bytes(), grammar_matcher_can_end(),
 *          grammar_matcher_done(), struct gm_mark, grammar_matcher_mark(), grammar_matcher_rewind(),
 *          grammar_matcher_step(), grammar_matcher_common_frame(), grammar_matcher_truncate(),
 *          grammar_matcher_key()
 */
#ifndef MOESERVE_ENGINE_GRAMMAR_H
#define MOESERVE_ENGINE_GRAMMAR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

enum {
    GRAMMAR_MAX_ELEMS = 1 << 18,
    GRAMMAR_MAX_RULES = 1 << 16,
    GRAMMAR_MAX_STACKS = 512,
    GRAMMAR_MAX_DEPTH = 4096, /* frames in one stack: output nested past it fails the matcher */
};

/* A set of byte values. */
struct gram_class {
    uint64_t w[4];
};
/* The bytes lo..hi (inclusive) added to c. */
void gram_class_range(struct gram_class *c, unsigned lo, unsigned hi);
static inline bool gram_class_has(const struct gram_class *c, unsigned b)
{
    return (c->w[b >> 6] >> (b & 63)) & 1u;
}

/* Builds a grammar. Every call past a bound or an allocation failure makes the builder failed
 * (sticky): the calls after it do nothing and gram_builder_finish reports the first failure, so a
 * compiler may build without checking each call. Rule and alternative ids are >= 0 (-1 once
 * failed). */
struct gram_alt_buf;
struct gram_builder {
    int n_rules;
    int32_t *rule_first_alt;   /* (n_rules) the rule's latest alternative, -1: none (a chain through alts) */
    struct gram_alt_buf *alts; /* (n_alts) owned */
    int n_alts, cap_alts, cap_rules;
    struct gram_class *classes; /* (n_classes) distinct classes, owned */
    int n_classes, cap_classes;
    size_t n_elems;            /* elements so far, ends of alternatives included */
    struct err err;            /* the first failure (code STATUS_OK while none) */
};
void gram_builder_init(struct gram_builder *b);
/* Safe on a zeroed builder. */
void gram_builder_free(struct gram_builder *b);
/* A new rule without alternatives (it matches nothing until one is added). */
int gram_rule(struct gram_builder *b);
/* A new, empty alternative of rule (empty: matches the empty string). */
int gram_alt(struct gram_builder *b, int rule);
/* Appends to alternative alt: the literal bytes s[0..n), one byte class, a reference to a rule. */
void gram_push_bytes(struct gram_builder *b, int alt, const char *s, size_t n);
void gram_push_class(struct gram_builder *b, int alt, const struct gram_class *c);
void gram_push_ref(struct gram_builder *b, int alt, int rule);
/* A new rule matching exactly the bytes s[0..n). */
int gram_rule_bytes(struct gram_builder *b, const char *s, size_t n);
/* A new rule: item repeated min..max times (max -1: unbounded), with sep (a rule, or -1 for none)
 * between consecutive items. Bounded forms become a chain of max rules. */
int gram_repeat(struct gram_builder *b, int item, int sep, int min, int max);
/* Checks the grammar (references resolved, no left recursion, every rule derives some string)
 * and makes it immutable, rooted at rule root; the builder is freed either way. The whole input
 * must match root. */
struct grammar;
enum status gram_builder_finish(struct gram_builder *b, int root, struct grammar **out, struct err *err);

/* Another owner of g (returns g); grammar_put drops one, the last frees. NULL is fine for both. */
struct grammar *grammar_ref(struct grammar *g);
void grammar_put(struct grammar *g);
int grammar_n_rules(const struct grammar *g);
size_t grammar_n_elems(const struct grammar *g);
/* *out = a new grammar matching prefix's sentences followed by g's, or g's alone when optional
 * (e.g. a thinking model's reasoning block before a JSON answer). The inputs are not changed. */
enum status grammar_prefix(const struct grammar *prefix, const struct grammar *g, bool optional, struct grammar **out,
                           struct err *err);
/* A hash of g's content (equal grammars, equal hashes), and whether a and b are the same grammar
 * by content (the same schema compiled twice): their matchers' states then mean the same. */
uint64_t grammar_fingerprint(const struct grammar *g);
bool grammar_same(const struct grammar *a, const struct grammar *b);

/* ---- matcher ---- */

/* A frame: pos indexes the grammar's elements (a byte class on a top frame, the element after a
 * reference on the others); parent is the frame below (-1: the bottom; GM_BOUNDARY: a cut, see
 * grammar_matcher_truncate). */
enum { GM_BOUNDARY = -2 };
struct gm_node {
    int32_t pos, parent;
    int32_t depth; /* frames from the bottom (1 for a bottom frame) */
};
/* A set of stacks: their top frames tops[begin..end) in the matcher's buffer; accept: the input
 * so far is a whole sentence; exposed (truncated states only): a stack popped through the cut, so
 * what lies below it may go on; next: the union of the tops' classes (the bytes that can follow). */
struct gm_state {
    int32_t begin, end;
    bool accept, exposed;
    struct gram_class next;
};
struct grammar_matcher {
    struct grammar *g;          /* a reference, owned */
    struct gm_node *nodes;      /* (cap_nodes) frames; [0, n_nodes) live, the state's and scratch's */
    int32_t n_nodes, cap_nodes;
    int32_t *tops;              /* (cap_tops) top-frame ids of the states being built */
    int32_t n_tops, cap_tops;
    struct gm_state cur;        /* the state after the bytes accepted so far */
    bool failed;                /* a bound was hit (too ambiguous, out of memory): nothing more is accepted */
    int32_t cut_depth;          /* the depth of the last grammar_matcher_truncate's cut (frames above it count from
                                   there, so the depth bound holds in truncated walks too) */
    /* compaction scratch */
    int32_t *remap;             /* (cap_remap) old frame -> new, then a hash table */
    int32_t cap_remap;
    int32_t *chain;             /* (cap_chain) one stack's frames not yet copied */
    int32_t cap_chain;
};
enum status grammar_matcher_init(struct grammar_matcher *m, struct grammar *g, struct err *err);
/* Safe on a zeroed matcher. */
void grammar_matcher_free(struct grammar_matcher *m);
/* Reads s[0..n): true and the state moves on if every prefix keeps the grammar alive; false and
 * the state is unchanged otherwise. */
bool grammar_matcher_accept_bytes(struct grammar_matcher *m, const uint8_t *s, size_t n);
/* The input so far is a whole sentence of the grammar. */
bool grammar_matcher_can_end(const struct grammar_matcher *m);
/* ... and no byte can follow it: generation is over. */
bool grammar_matcher_done(const struct grammar_matcher *m);

/* For walking many continuations from one state (token masks): mark, step byte by byte from
 * m->cur or a stepped state, rewind to the mark; the steps leave m->cur as it is. */
struct gm_mark {
    int32_t n_nodes, n_tops;
};
struct gm_mark grammar_matcher_mark(const struct grammar_matcher *m);
void grammar_matcher_rewind(struct grammar_matcher *m, struct gm_mark mk);
/* to = from after byte b; false (to empty) when b cannot follow from or a bound was hit. */
bool grammar_matcher_step(struct grammar_matcher *m, const struct gm_state *from, uint8_t b, struct gm_state *to);
/* The frame every stack of m->cur passes through nearest their tops (below each top), or -1
 * when the stacks share none. */
int32_t grammar_matcher_common_frame(const struct grammar_matcher *m);
/* to = m->cur with frame `cut` and everything below it replaced by GM_BOUNDARY (new frames on the
 * scratch stack): what the stacks do above the cut. Stepping it behaves as m->cur until a stack
 * pops through the cut, which makes the state exposed instead of following the frames below; so
 * a byte string a truncated walk accepts without exposure is accepted by m->cur, and one that
 * m->cur accepts is accepted by the truncated walk or passes an exposed state. cut must be
 * grammar_matcher_common_frame(m) or a frame below it. */
bool grammar_matcher_truncate(struct grammar_matcher *m, int32_t cut, struct gm_state *to);
/* State st's stacks by content (not node ids), written to key[0..cap): equal keys, equal states
 * (token masks are cached by it). Returns the length the whole key needs (more than cap: cut). */
size_t grammar_matcher_key(const struct grammar_matcher *m, const struct gm_state *st, int32_t *key, size_t cap);

#endif
