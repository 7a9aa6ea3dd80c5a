/* jinja_text.h — Python `str` semantics on UTF-8 bytes, for the chat-template
 * interpreter: code-point walking, whitespace, case mapping, float repr,
 * string repr, and a growable byte buffer.
 *
 * Strings are byte arrays that are normally UTF-8. Invalid bytes are never
 * rejected: each one counts as a code point of its own and is copied through
 * unchanged, so indexing, slicing and printing stay total on any input.
 * Case mapping covers what libc's C.UTF-8 towupper/towlower know (simple,
 * one-to-one mappings; no 'ß' -> "SS").
 *
 * defines: struct jbuf, jbuf_*(), jtext_*()
 */
#ifndef MOESERVE_TEMPLATE_JINJA_TEXT_H
#define MOESERVE_TEMPLATE_JINJA_TEXT_H

#include <locale.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer; `limit` (0 = none) caps len, and an append that
 * would pass it fails like an allocation failure but sets `over`. */
struct jbuf {
    char *p; /* (cap) owned, NUL-terminated when non-NULL */
    size_t len;
    size_t cap;
    size_t limit;
    bool over; /* an append failed because of `limit` */
};

bool jbuf_put(struct jbuf *b, const char *s, size_t n);
bool jbuf_putc(struct jbuf *b, char c);
bool jbuf_puts(struct jbuf *b, const char *s);
bool jbuf_printf(struct jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool jbuf_put_cp(struct jbuf *b, uint32_t cp); /* UTF-8 encode */
void jbuf_free(struct jbuf *b);

/* Decodes one code point at s[0..n) (n > 0); returns its byte length (1..4).
 * An invalid byte decodes as itself (cp = byte) with length 1. */
size_t jtext_decode(const char *s, size_t n, uint32_t *cp);
size_t jtext_count_cp(const char *s, size_t n);
/* Byte offset of code point index `i` (clamped to n). */
size_t jtext_cp_offset(const char *s, size_t n, size_t i);

bool jtext_isspace(uint32_t cp);     /* Python str.isspace() */
bool jtext_isalnum(uint32_t cp);     /* approximation of Python's \w minus '_' */
bool jtext_islinebreak(uint32_t cp); /* Python str.splitlines() boundaries */

/* Case mapping of one code point (loc may be (locale_t)0: ASCII only). */
uint32_t jtext_upper(locale_t loc, uint32_t cp);
uint32_t jtext_lower(locale_t loc, uint32_t cp);
bool jtext_is_upper(locale_t loc, uint32_t cp);
bool jtext_is_lower(locale_t loc, uint32_t cp);
bool jtext_is_cased(locale_t loc, uint32_t cp);

/* Python float.__repr__ (shortest round-trip): 1.0, 0.1, 1e-05, 1e+16, inf, nan. */
bool jtext_float_repr(struct jbuf *b, double v);
/* Python repr() of a str: quotes chosen as Python does, escapes included. */
bool jtext_str_repr(struct jbuf *b, const char *s, size_t n);
/* markupsafe.escape: & < > " ' */
bool jtext_html_escape(struct jbuf *b, const char *s, size_t n);

#endif
