/* unicode.c — utf8proc behind unicode.h; hand-written UTF-8 codecs.
 *
 * The only file that includes utf8proc.h. The UTF-8 rules follow Unicode
 * Table 3-7 (well-formed byte sequences), which is also what Rust's
 * str::from_utf8 and String::from_utf8_lossy implement.
 */
#include "base/unicode.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Second-byte range allowed after lead byte b (Table 3-7); lo > hi if b is no lead. */
static void utf8_second_range(unsigned char b, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b == 0xE0)
        *lo = 0xA0;
    else if (b == 0xED)
        *hi = 0x9F;
    else if (b == 0xF0)
        *lo = 0x90;
    else if (b == 0xF4)
        *hi = 0x8F;
}

size_t unicode_utf8_char_len(unsigned char b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF)
        return 3;
    if (b >= 0xF0 && b <= 0xF4)
        return 4;
    return 1;
}

/* Width of the well-formed prefix at s[i..len): returns the length of a whole
 * valid char, or 0 with *bad = number of bytes forming the maximal ill-formed
 * subpart (>= 1) — which may be a truncated but valid prefix at the end. */
static size_t utf8_step(const unsigned char *s, size_t len, size_t i, size_t *bad, bool *truncated)
{
    unsigned char b = s[i];
    *truncated = false;
    if (b < 0x80)
        return 1;
    size_t w = (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3 : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
    if (w == 0) {
        *bad = 1;
        return 0;
    }
    unsigned char lo, hi;
    utf8_second_range(b, &lo, &hi);
    for (size_t k = 1; k < w; k++) {
        if (i + k >= len) {
            *bad = k;
            *truncated = true;
            return 0;
        }
        unsigned char c = s[i + k];
        bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
        if (!ok) {
            *bad = k;
            return 0;
        }
    }
    return w;
}

bool unicode_utf8_validate(const char *str, size_t len, size_t *bad_off)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= len) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (v & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= len)
            break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad;
        bool trunc;
        size_t w = utf8_step(s, len, i, &bad, &trunc);
        if (!w) {
            if (bad_off)
                *bad_off = i;
            return false;
        }
        i += w;
    }
    return true;
}

size_t unicode_utf8_decode(const char *str, size_t len, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)str;
    unsigned char b = s[0];
    if (b < 0x80 || len < 2) {
        *cp = b;
        return 1;
    }
    if (b < 0xE0) {
        *cp = (uint32_t)(b & 0x1F) << 6 | (s[1] & 0x3F);
        return 2;
    }
    if (b < 0xF0 || len < 4) {
        if (len < 3) {
            *cp = b;
            return 1;
        }
        *cp = (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        return 3;
    }
    *cp = (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
          (s[3] & 0x3F);
    return 4;
}

size_t unicode_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t unicode_utf8_lossy(const char *in, size_t len, char *out)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0, o = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            out[o++] = (char)s[i++];
            continue;
        }
        size_t bad;
        bool trunc;
        size_t w = utf8_step(s, len, i, &bad, &trunc);
        if (w) {
            memcpy(out + o, s + i, w);
            o += w;
            i += w;
        } else {
            o += unicode_utf8_encode(UNICODE_REPLACEMENT, out + o);
            i += bad;
        }
    }
    return o;
}

size_t unicode_utf8_incomplete_tail(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        size_t p = len - back;
        if ((s[p] & 0xC0) == 0x80)
            continue; /* continuation byte: keep looking for the lead */
        size_t bad;
        bool trunc;
        size_t w = utf8_step(s, len, p, &bad, &trunc);
        return (!w && trunc) ? back : 0;
    }
    return 0;
}

bool unicode_is_nfc_quick(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0xCC) { /* below U+0300 (or a continuation byte of one) */
            i++;
            continue;
        }
        uint32_t cp;
        i += unicode_utf8_decode(str + i, len - i, &cp);
        bool ok = (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA) ||
                  (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
                  (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xFF01 && cp <= 0xFF60) ||
                  (cp >= 0x1F300 && cp <= 0x1F64F) || (cp >= 0x1F900 && cp <= 0x1F9FF);
        if (!ok)
            return false;
    }
    return true;
}

enum status unicode_normalize(enum unicode_form form, const char *s, size_t len, char **out, size_t *out_len,
                              struct err *err)
{
    *out = NULL;
    *out_len = 0;
    if (len == 0) {
        *out = calloc(1, 1);
        return *out ? STATUS_OK : err_set(err, STATUS_NOMEM, "unicode normalisation: out of memory");
    }
    int opt = UTF8PROC_STABLE;
    switch (form) {
    case UNICODE_NFC: opt |= UTF8PROC_COMPOSE; break;
    case UNICODE_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case UNICODE_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case UNICODE_NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t n =
        utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst, (utf8proc_option_t)opt);
    if (n < 0) {
        free(dst);
        if (n == UTF8PROC_ERROR_NOMEM)
            return err_set(err, STATUS_NOMEM, "unicode normalisation: out of memory");
        return err_set(err, STATUS_INVALID, "unicode normalisation: %s", utf8proc_errmsg(n));
    }
    *out = (char *)dst;
    *out_len = (size_t)n;
    return STATUS_OK;
}

enum unicode_cat unicode_category(uint32_t cp)
{
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: return UNICODE_CAT_LU;
    case UTF8PROC_CATEGORY_LL: return UNICODE_CAT_LL;
    case UTF8PROC_CATEGORY_LT: return UNICODE_CAT_LT;
    case UTF8PROC_CATEGORY_LM: return UNICODE_CAT_LM;
    case UTF8PROC_CATEGORY_LO: return UNICODE_CAT_LO;
    case UTF8PROC_CATEGORY_MN: return UNICODE_CAT_MN;
    case UTF8PROC_CATEGORY_MC: return UNICODE_CAT_MC;
    case UTF8PROC_CATEGORY_ME: return UNICODE_CAT_ME;
    case UTF8PROC_CATEGORY_ND: return UNICODE_CAT_ND;
    case UTF8PROC_CATEGORY_NL: return UNICODE_CAT_NL;
    case UTF8PROC_CATEGORY_NO: return UNICODE_CAT_NO;
    case UTF8PROC_CATEGORY_PC: return UNICODE_CAT_PC;
    case UTF8PROC_CATEGORY_PD: return UNICODE_CAT_PD;
    case UTF8PROC_CATEGORY_PS: return UNICODE_CAT_PS;
    case UTF8PROC_CATEGORY_PE: return UNICODE_CAT_PE;
    case UTF8PROC_CATEGORY_PI: return UNICODE_CAT_PI;
    case UTF8PROC_CATEGORY_PF: return UNICODE_CAT_PF;
    case UTF8PROC_CATEGORY_PO: return UNICODE_CAT_PO;
    case UTF8PROC_CATEGORY_SM: return UNICODE_CAT_SM;
    case UTF8PROC_CATEGORY_SC: return UNICODE_CAT_SC;
    case UTF8PROC_CATEGORY_SK: return UNICODE_CAT_SK;
    case UTF8PROC_CATEGORY_SO: return UNICODE_CAT_SO;
    case UTF8PROC_CATEGORY_ZS: return UNICODE_CAT_ZS;
    case UTF8PROC_CATEGORY_ZL: return UNICODE_CAT_ZL;
    case UTF8PROC_CATEGORY_ZP: return UNICODE_CAT_ZP;
    case UTF8PROC_CATEGORY_CC: return UNICODE_CAT_CC;
    case UTF8PROC_CATEGORY_CF: return UNICODE_CAT_CF;
    case UTF8PROC_CATEGORY_CS: return UNICODE_CAT_CS;
    case UTF8PROC_CATEGORY_CO: return UNICODE_CAT_CO;
    default: return UNICODE_CAT_CN;
    }
}

bool unicode_is_whitespace(uint32_t cp)
{
    if (cp < 0x80)
        return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Other_Alphabetic symbols (circled/squared letters) that are So, not L. */
static bool unicode_is_alpha_symbol(uint32_t cp)
{
    return (cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
           (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189);
}

bool unicode_is_word(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == '_';
    if (cp == 0x200C || cp == 0x200D)
        return true;
    enum unicode_cat c = unicode_category(cp);
    return (c >= UNICODE_CAT_LU && c <= UNICODE_CAT_ND) || c == UNICODE_CAT_NL || c == UNICODE_CAT_PC ||
           unicode_is_alpha_symbol(cp);
}

bool unicode_is_numeric(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    enum unicode_cat c = unicode_category(cp);
    return c == UNICODE_CAT_ND || c == UNICODE_CAT_NL || c == UNICODE_CAT_NO;
}

bool unicode_is_punctuation(uint32_t cp)
{
    enum unicode_cat c = unicode_category(cp);
    return c >= UNICODE_CAT_PC && c <= UNICODE_CAT_PO;
}

size_t unicode_to_lower(uint32_t cp, uint32_t out[3])
{
    if (cp == 0x130) { /* the one unconditional multi-char lowercase mapping */
        out[0] = 0x69;
        out[1] = 0x307;
        return 2;
    }
    out[0] = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
    return 1;
}
