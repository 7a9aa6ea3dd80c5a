/* regex.h — the one wrapper over PCRE2 (8-bit, UTF + UCP, JIT where available).
 *
 * A compiled struct regex is immutable and shared by all threads; each thread
 * (or call) brings its own struct regex_scratch holding the match data and a
 * JIT stack, so there is no global state and no locking.
 * REGEX_ONIG makes a pattern mean what it means to Oniguruma (the engine
 * behind Hugging Face `tokenizers`): \s/\S are Unicode White_Space (PCRE2
 * also counts U+180E), \w/\W are Unicode word characters (Alphabetic, marks,
 * Nd, Pc, joiners — PCRE2's \w is L, N and '_'), and ^/$ match at line ends
 * (Ruby syntax). \S and \W inside a [...] class keep PCRE2's meaning.
 *
 * Does not: capture groups (only the whole match), replace, or check subjects
 * for UTF-8 validity (callers pass validated text, at char boundaries).
 *
 * defines: struct regex, REGEX_ONIG, regex_compile(), regex_free(),
 *          struct regex_scratch, regex_scratch_free(), regex_find()
 */
#ifndef MOESERVE_BASE_REGEX_H
#define MOESERVE_BASE_REGEX_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

struct regex;

#define REGEX_ONIG 1u

/* `what` names the pattern's origin in error messages (a JSON path). */
enum status regex_compile(struct regex **out, const char *pattern, size_t len, unsigned flags,
                          const char *what, struct err *err);
void regex_free(struct regex *re);

/* Per-thread match state; zero-initialise, free with regex_scratch_free. */
struct regex_scratch {
    void *match_data; /* pcre2_match_data*, created on first use */
    void *context;    /* pcre2_match_context*, created when the JIT needs a bigger stack */
    void *jit_stack;  /* pcre2_jit_stack* */
};
void regex_scratch_free(struct regex_scratch *s);

/* Leftmost match in subject[start..len): *found, and [*mstart, *mend) when found.
 * Fails only on resource limits (catastrophic patterns) or OOM. */
enum status regex_find(const struct regex *re, struct regex_scratch *s, const char *subject, size_t len,
                       size_t start, bool *found, size_t *mstart, size_t *mend, struct err *err);

#endif
