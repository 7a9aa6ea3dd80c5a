/* unicode.h — the one wrapper over utf8proc, plus UTF-8 helpers.
 *
 * UTF-8 validation and decoding, Unicode normalisation (NFC/NFD/NFKC/NFKD),
 * general categories and the few character classes the tokenizer needs with
 * the exact meaning of Rust's `char` methods (is_whitespace = White_Space,
 * is_numeric = N*, to_lowercase = full per-char mapping) and of Rust/Onig `\w`.
 * Also String::from_utf8_lossy's replacement rule (one U+FFFD per maximal
 * ill-formed subpart), used by decoding.
 *
 * Does not: allocate except in unicode_normalize(); keep any state (all
 * functions are thread-safe).
 * Invariant: functions taking "valid" text assume it passed
 * unicode_utf8_validate().
 *
 * defines: unicode_utf8_validate(), unicode_utf8_decode(), unicode_utf8_encode(),
 *          unicode_utf8_char_len(), unicode_utf8_lossy(), unicode_utf8_incomplete_tail(),
 *          enum unicode_form, unicode_is_nfc_quick(), unicode_normalize(),
 *          enum unicode_cat, unicode_category(),
 *          unicode_is_whitespace(), unicode_is_word(), unicode_is_numeric(),
 *          unicode_is_punctuation(), unicode_to_lower()
 */
#ifndef MOESERVE_BASE_UNICODE_H
#define MOESERVE_BASE_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define UNICODE_REPLACEMENT 0xFFFDu

/* True if s[0..len) is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
 * Otherwise *bad_off (may be NULL) receives the offset of the first bad byte. */
bool unicode_utf8_validate(const char *s, size_t len, size_t *bad_off);

/* Decodes the char at s (valid UTF-8, len >= 1); returns its byte length. */
size_t unicode_utf8_decode(const char *s, size_t len, uint32_t *cp);
/* Byte length of the char starting with lead byte b (1 for a stray byte). */
size_t unicode_utf8_char_len(unsigned char b);
/* Writes cp (<= U+10FFFF, not a surrogate) to out; returns 1..4. */
size_t unicode_utf8_encode(uint32_t cp, char out[4]);

/* String::from_utf8_lossy: copies in to out replacing each maximal ill-formed
 * subpart by U+FFFD. out must hold 3 * len bytes. Returns the bytes written. */
size_t unicode_utf8_lossy(const char *in, size_t len, char *out);
/* Length of the trailing bytes of s that form an incomplete but so far
 * well-formed sequence (0..3): what a stream must hold back. */
size_t unicode_utf8_incomplete_tail(const char *s, size_t len);

enum unicode_form { UNICODE_NFC, UNICODE_NFD, UNICODE_NFKC, UNICODE_NFKD };

/* True when valid UTF-8 s is certainly in NFC already: every char has
 * canonical class 0 and NFC_Quick_Check = Yes (a conservative list: below
 * U+0300, kana letters, CJK ideographs, Hangul syllables, fullwidth forms,
 * emoji). False means "maybe not": run unicode_normalize. */
bool unicode_is_nfc_quick(const char *s, size_t len);

/* Normalises valid UTF-8 into a malloc'ed, NUL-terminated *out (caller frees). */
enum status unicode_normalize(enum unicode_form form, const char *s, size_t len, char **out, size_t *out_len,
                              struct err *err);

/* General category, major class first (the letter of \p{X}). */
enum unicode_cat {
    UNICODE_CAT_CN, /* unassigned */
    UNICODE_CAT_LU,
    UNICODE_CAT_LL,
    UNICODE_CAT_LT,
    UNICODE_CAT_LM,
    UNICODE_CAT_LO,
    UNICODE_CAT_MN,
    UNICODE_CAT_MC,
    UNICODE_CAT_ME,
    UNICODE_CAT_ND,
    UNICODE_CAT_NL,
    UNICODE_CAT_NO,
    UNICODE_CAT_PC,
    UNICODE_CAT_PD,
    UNICODE_CAT_PS,
    UNICODE_CAT_PE,
    UNICODE_CAT_PI,
    UNICODE_CAT_PF,
    UNICODE_CAT_PO,
    UNICODE_CAT_SM,
    UNICODE_CAT_SC,
    UNICODE_CAT_SK,
    UNICODE_CAT_SO,
    UNICODE_CAT_ZS,
    UNICODE_CAT_ZL,
    UNICODE_CAT_ZP,
    UNICODE_CAT_CC,
    UNICODE_CAT_CF,
    UNICODE_CAT_CS,
    UNICODE_CAT_CO,
};

enum unicode_cat unicode_category(uint32_t cp);
bool unicode_is_whitespace(uint32_t cp);  /* White_Space (Rust char::is_whitespace) */
bool unicode_is_word(uint32_t cp);        /* Unicode \w: Alphabetic, M, Nd, Pc, Join_Control */
bool unicode_is_numeric(uint32_t cp);     /* N* (Rust char::is_numeric) */
bool unicode_is_punctuation(uint32_t cp); /* P* */
/* Full lowercase mapping of one char (Rust char::to_lowercase); returns 1..3. */
size_t unicode_to_lower(uint32_t cp, uint32_t out[3]);

#endif
