/* grammar_regex.h — a JSON Schema "pattern" (a simple regular expression) to grammar rules.
 *
 * The rule matches the JSON-encoded body of a string (between its quotes) whose decoded value the
 * pattern matches, ECMA-262 style: unanchored unless it starts with ^ / ends with $, so "ab"
 * means "contains ab". Taken: literal characters (any Unicode), ., classes [...] and [^...] of
 * ASCII characters and ranges, \d \w \s \D \W \S, escaped punctuation, \t \n \r \f \v, \uXXXX,
 * groups (...) and (?:...), alternation |, quantifiers * + ? {n} {n,} {n,m} (greedy), ^ at the
 * start and $ at the end. A character the JSON text must escape (" \ and controls) is matched in
 * its short escape form (\" \\ \n ...), the others as themselves (a \u escape of a plain character
 * is not generated). Anything else (backreferences, lookaround, \b, \p{...}, lazy or possessive
 * quantifiers, anchors inside) is STATUS_UNSUPPORTED naming it; at most GRAMMAR_REGEX_MAX_LEN
 * pattern bytes and GRAMMAR_REGEX_MAX_REPEAT for a {n,m} bound.
 *
 * defines: GRAMMAR_REGEX_MAX_LEN, GRAMMAR_REGEX_MAX_REPEAT, grammar_regex_rule()
 */
#ifndef MOESERVE_ENGINE_GRAMMAR_REGEX_H
#define MOESERVE_ENGINE_GRAMMAR_REGEX_H

#include "base/status.h"
#include "engine/grammar.h"

enum { GRAMMAR_REGEX_MAX_LEN = 1024, GRAMMAR_REGEX_MAX_REPEAT = 1000 };

/* A rule of b for the string bodies pattern matches; utf8 is a rule of b matching one whole
 * non-ASCII UTF-8 character (what . and negated classes take beyond ASCII). -1 with err set
 * (the message names the pattern's offending part) when the pattern is refused. */
int grammar_regex_rule(struct gram_builder *b, const char *pattern, int utf8, struct err *err);

#endif
