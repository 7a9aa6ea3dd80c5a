/* jinja_text.c — Python `str` semantics on UTF-8 bytes (see jinja_text.h).
 *
 * Deliberately not a Unicode database: whitespace, line breaks and
 * "printable" follow Python for every code point a chat template is likely
 * to meet (ASCII, Latin-1, the general punctuation and space blocks); case
 * mapping is delegated to the C.UTF-8 locale the caller passes in.
 */
#include "template/jinja_text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

bool jbuf_put(struct jbuf *b, const char *s, size_t n)
{
    if (b->limit && (b->len + n > b->limit || b->len + n < b->len)) {
        b->over = true;
        return false;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2)
                return false;
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p)
            return false;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

bool jbuf_putc(struct jbuf *b, char c)
{
    return jbuf_put(b, &c, 1);
}

bool jbuf_puts(struct jbuf *b, const char *s)
{
    return jbuf_put(b, s, strlen(s));
}

bool jbuf_printf(struct jbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return false;
    if ((size_t)n < sizeof tmp)
        return jbuf_put(b, tmp, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big)
        return false;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    bool ok = jbuf_put(b, big, (size_t)n);
    free(big);
    return ok;
}

bool jbuf_put_cp(struct jbuf *b, uint32_t cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | ((cp >> 18) & 0x07));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return jbuf_put(b, u, n);
}

void jbuf_free(struct jbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

size_t jtext_decode(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        v = c & 0x1F;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        v = c & 0x0F;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        v = c & 0x07;
        min = 0x10000;
    } else {
        *cp = c;
        return 1;
    }
    if (len > n) {
        *cp = c;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *cp = c;
            return 1;
        }
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF) {
        *cp = c;
        return 1;
    }
    *cp = v;
    return len;
}

size_t jtext_count_cp(const char *s, size_t n)
{
    size_t count = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += jtext_decode(s + i, n - i, &cp);
        count++;
    }
    return count;
}

size_t jtext_cp_offset(const char *s, size_t n, size_t idx)
{
    size_t i = 0;
    for (size_t k = 0; k < idx && i < n; k++) {
        uint32_t cp;
        i += jtext_decode(s + i, n - i, &cp);
    }
    return i;
}

bool jtext_isspace(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool jtext_islinebreak(uint32_t cp)
{
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

bool jtext_isalnum(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
    /* Beyond ASCII: letters and digits of most scripts; exclude the spaces,
     * Latin-1 punctuation and the general punctuation block. */
    if (jtext_isspace(cp))
        return false;
    if (cp < 0xC0)
        return cp == 0xAA || cp == 0xB5 || cp == 0xBA || cp == 0xB2 || cp == 0xB3 || cp == 0xB9 ||
               (cp >= 0xBC && cp <= 0xBE);
    if (cp == 0xD7 || cp == 0xF7)
        return false;
    if (cp >= 0x2000 && cp <= 0x2BFF)
        return false;
    if (cp >= 0x3000 && cp <= 0x303F)
        return false;
    if (cp >= 0xFF00 && cp <= 0xFF0F)
        return false;
    if (cp >= 0x1F000 && cp <= 0x1FFFF)
        return false;
    return true;
}

uint32_t jtext_upper(locale_t loc, uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
    if (!loc)
        return cp;
    wint_t r = towupper_l((wint_t)cp, loc);
    return r == WEOF ? cp : (uint32_t)r;
}

uint32_t jtext_lower(locale_t loc, uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    if (!loc)
        return cp;
    wint_t r = towlower_l((wint_t)cp, loc);
    return r == WEOF ? cp : (uint32_t)r;
}

bool jtext_is_upper(locale_t loc, uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 'A' && cp <= 'Z';
    return loc && iswupper_l((wint_t)cp, loc);
}

bool jtext_is_lower(locale_t loc, uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 'a' && cp <= 'z';
    return loc && iswlower_l((wint_t)cp, loc);
}

bool jtext_is_cased(locale_t loc, uint32_t cp)
{
    return jtext_is_upper(loc, cp) || jtext_is_lower(loc, cp) || jtext_upper(loc, cp) != cp ||
           jtext_lower(loc, cp) != cp;
}

bool jtext_float_repr(struct jbuf *b, double v)
{
    if (isnan(v))
        return jbuf_puts(b, "nan");
    if (isinf(v))
        return jbuf_puts(b, v < 0 ? "-inf" : "inf");
    if (v == 0)
        return jbuf_puts(b, signbit(v) ? "-0.0" : "0.0");
    /* Shortest precision that round-trips, as Python's repr does. */
    char tmp[64];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    char digits[32];
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int decpt = exp10 + 1; /* value = 0.digits * 10^decpt */
    struct jbuf *o = b;
    if (neg && !jbuf_putc(o, '-'))
        return false;
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            if (!jbuf_puts(o, "0."))
                return false;
            for (int i = 0; i < -decpt; i++)
                if (!jbuf_putc(o, '0'))
                    return false;
            return jbuf_put(o, digits, nd);
        }
        if ((size_t)decpt >= nd) {
            if (!jbuf_put(o, digits, nd))
                return false;
            for (size_t i = nd; i < (size_t)decpt; i++)
                if (!jbuf_putc(o, '0'))
                    return false;
            return jbuf_puts(o, ".0");
        }
        return jbuf_put(o, digits, (size_t)decpt) && jbuf_putc(o, '.') &&
               jbuf_put(o, digits + decpt, nd - (size_t)decpt);
    }
    if (!jbuf_putc(o, digits[0]))
        return false;
    if (nd > 1 && !(jbuf_putc(o, '.') && jbuf_put(o, digits + 1, nd - 1)))
        return false;
    int e = decpt - 1;
    return jbuf_printf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
}

/* Python's str.isprintable() per code point, approximately (no Cn table). */
static bool text_printable(uint32_t cp)
{
    if (cp < 0x20 || cp == 0x7F)
        return false;
    if (cp < 0x7F)
        return true;
    if (cp <= 0xA0 || cp == 0xAD)
        return false;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
        (cp >= 0x205F && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) || cp == 0x3000)
        return false;
    if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F || cp == 0x180E)
        return false;
    if (cp >= 0xD800 && cp <= 0xF8FF) /* surrogates, private use */
        return false;
    if (cp == 0xFEFF || (cp >= 0xFFF0 && cp <= 0xFFFB) || cp == 0xFFFE || cp == 0xFFFF)
        return false;
    if (cp >= 0xE0000)
        return false;
    return true;
}

bool jtext_str_repr(struct jbuf *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    if (!jbuf_putc(b, q))
        return false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = jtext_decode(s + i, n - i, &cp);
        bool ok = true;
        if (l == 1 && (unsigned char)s[i] >= 0x80) {
            /* an invalid byte: Python would hold a surrogate escape here */
            ok = jbuf_printf(b, "\\udc%02x", (unsigned char)s[i]);
        } else if (cp == (uint32_t)q || cp == '\\') {
            ok = jbuf_putc(b, '\\') && jbuf_putc(b, (char)cp);
        } else if (cp == '\t') {
            ok = jbuf_puts(b, "\\t");
        } else if (cp == '\n') {
            ok = jbuf_puts(b, "\\n");
        } else if (cp == '\r') {
            ok = jbuf_puts(b, "\\r");
        } else if (!text_printable(cp)) {
            if (cp < 0x100)
                ok = jbuf_printf(b, "\\x%02x", cp);
            else if (cp < 0x10000)
                ok = jbuf_printf(b, "\\u%04x", cp);
            else
                ok = jbuf_printf(b, "\\U%08x", cp);
        } else {
            ok = jbuf_put(b, s + i, l);
        }
        if (!ok)
            return false;
        i += l;
    }
    return jbuf_putc(b, q);
}

bool jtext_html_escape(struct jbuf *b, const char *s, size_t n)
{
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        const char *rep = NULL;
        switch (s[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&#34;"; break;
        case '\'': rep = "&#39;"; break;
        default: break;
        }
        if (rep) {
            if (!jbuf_put(b, s + start, i - start) || !jbuf_puts(b, rep))
                return false;
            start = i + 1;
        }
    }
    return jbuf_put(b, s + start, n - start);
}
