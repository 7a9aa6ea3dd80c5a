/* grammar_json.c — JSON Schema (strict subset) to a grammar of the JSON text that validates.
 *
 * One rule per schema node, memoised by node, so a $defs entry used twice is compiled once and a
 * $ref back to an enclosing schema becomes a reference to its rule (recursion). Whitespace is
 * written after tokens only ("{" ws, value ws, "," ws), never before, so the grammar stays
 * unambiguous: one stack a continuation, instead of one a way to split a run of blanks.
 *
 * Objects: members in the order of "properties", optional ones skippable. With n properties:
 *   A_i = the members from i on, none written yet;  B_i = the same after a member ("," first)
 *   A_i ::= m_i B_{i+1} | A_{i+1} (optional i);     B_i ::= "," ws m_i B_{i+1} | B_{i+1} (optional i)
 * and A_{n+1} / B_{n+1} end the object or go on with other keys where additionalProperties allows.
 *
 * Not checked by the grammar (so refused or documented in grammar_json.h): numeric ranges,
 * uniqueness, an extra key equal to a listed one.
 */
#include "engine/grammar_json.h"

#include "engine/grammar_regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JC_MAX_MEMO = 4096, JC_MAX_COUNT = 100000 };

struct jc_memo {
    const struct json *schema;
    int rule;
};

struct jc {
    struct gram_builder *b;  /* the grammar being built: grammar_json_compile's own, or a sub's caller's */
    const struct json *root; /* of the schema being compiled ($ref "#") */
    int ws_max;
    char path[512];
    size_t path_len;
    enum status st;
    struct err *err;
    int depth;
    struct jc_memo *memo; /* (n_memo) owned */
    int n_memo, cap_memo;
    /* shared rules, made on first use (-1 before) */
    int ws, value, string, number, integer, boolean, null, str_char, object_any, array_any, utf8;
};

/* ---- errors and paths ---- */

static bool jc_ok(const struct jc *c)
{
    return c->st == STATUS_OK && c->b->err.code == STATUS_OK;
}

__attribute__((format(printf, 3, 4))) static int jc_fail(struct jc *c, enum status st, const char *fmt, ...)
{
    if (c->st != STATUS_OK)
        return -1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = err_set(c->err, st, "%s: %s", c->path, msg);
    return -1;
}

static size_t path_push(struct jc *c, const char *fmt, const char *s)
{
    size_t old = c->path_len;
    int n = snprintf(c->path + old, sizeof c->path - old, fmt, s);
    if (n > 0)
        c->path_len = old + (size_t)n < sizeof c->path ? old + (size_t)n : sizeof c->path - 1;
    return old;
}

static void path_pop(struct jc *c, size_t old)
{
    c->path_len = old;
    c->path[old] = 0;
}

/* ---- small grammar pieces ---- */

static struct gram_class cls_range(unsigned lo, unsigned hi)
{
    struct gram_class k = {{0}};
    gram_class_range(&k, lo, hi);
    return k;
}

/* A rule of one byte class. */
static int rule_class(struct jc *c, struct gram_class k)
{
    int r = gram_rule(c->b);
    gram_push_class(c->b, gram_alt(c->b, r), &k);
    return r;
}

static int rule_seq2(struct jc *c, int x, int y)
{
    int r = gram_rule(c->b);
    int a = gram_alt(c->b, r);
    gram_push_ref(c->b, a, x);
    gram_push_ref(c->b, a, y);
    return r;
}

static int ws_rule(struct jc *c)
{
    if (c->ws >= 0)
        return c->ws;
    struct gram_class k = {{0}};
    gram_class_range(&k, ' ', ' ');
    gram_class_range(&k, '\t', '\t');
    gram_class_range(&k, '\n', '\n');
    if (c->ws_max <= 0) {
        c->ws = gram_rule(c->b);
        gram_alt(c->b, c->ws);
    } else {
        c->ws = gram_repeat(c->b, rule_class(c, k), -1, 0, c->ws_max);
    }
    return c->ws;
}

static int utf8_rule(struct jc *c);

/* One character of a JSON string: a printable ASCII byte but " and \, an escape, or one whole
 * UTF-8 sequence of a code point (no surrogates, no overlongs). */
static int str_char_rule(struct jc *c)
{
    if (c->str_char >= 0)
        return c->str_char;
    struct gram_builder *b = c->b;
    int r = gram_rule(b);
    struct gram_class ascii = cls_range(0x20, 0x7e);
    ascii.w[0] &= ~(1ull << '"');
    ascii.w[1] &= ~(1ull << ('\\' - 64));
    gram_push_class(b, gram_alt(b, r), &ascii);
    /* escapes */
    struct gram_class esc = {{0}};
    const char *e = "\"\\/bfnrt";
    for (; *e; e++)
        gram_class_range(&esc, (unsigned char)*e, (unsigned char)*e);
    int a = gram_alt(b, r);
    gram_push_bytes(b, a, "\\", 1);
    gram_push_class(b, a, &esc);
    struct gram_class hex = cls_range('0', '9');
    gram_class_range(&hex, 'a', 'f');
    gram_class_range(&hex, 'A', 'F');
    a = gram_alt(b, r);
    gram_push_bytes(b, a, "\\u", 2);
    for (int i = 0; i < 4; i++)
        gram_push_class(b, a, &hex);
    gram_push_ref(b, gram_alt(b, r), utf8_rule(c));
    return c->str_char = r;
}

/* One whole non-ASCII UTF-8 character (RFC 3629's table: no surrogates, no overlongs). */
static int utf8_rule(struct jc *c)
{
    if (c->utf8 >= 0)
        return c->utf8;
    struct gram_builder *b = c->b;
    int r = gram_rule(b), a;
    const struct gram_class cont = cls_range(0x80, 0xbf);
    static const unsigned seqs[][4][2] = {
        {{0xc2, 0xdf}, {0, 0}, {0, 0}, {0, 0}},       {{0xe0, 0xe0}, {0xa0, 0xbf}, {0, 0}, {0, 0}},
        {{0xe1, 0xec}, {0x80, 0xbf}, {0, 0}, {0, 0}}, {{0xed, 0xed}, {0x80, 0x9f}, {0, 0}, {0, 0}},
        {{0xee, 0xef}, {0x80, 0xbf}, {0, 0}, {0, 0}}, {{0xf0, 0xf0}, {0x90, 0xbf}, {0x80, 0xbf}, {0, 0}},
        {{0xf1, 0xf3}, {0x80, 0xbf}, {0x80, 0xbf}, {0, 0}}, {{0xf4, 0xf4}, {0x80, 0x8f}, {0x80, 0xbf}, {0, 0}},
    };
    for (size_t s = 0; s < sizeof seqs / sizeof seqs[0]; s++) {
        a = gram_alt(b, r);
        for (int i = 0; i < 4 && seqs[s][i][0]; i++) {
            struct gram_class k = cls_range(seqs[s][i][0], seqs[s][i][1]);
            gram_push_class(b, a, &k);
        }
        gram_push_class(b, a, &cont); /* every sequence ends with a continuation byte */
    }
    return c->utf8 = r;
}

/* "\"" chars{min,max} "\"" (max -1: unbounded). */
static int string_rule(struct jc *c, int min, int max)
{
    if (min == 0 && max < 0 && c->string >= 0)
        return c->string;
    int body = gram_repeat(c->b, str_char_rule(c), -1, min, max);
    int r = gram_rule(c->b);
    int a = gram_alt(c->b, r);
    gram_push_bytes(c->b, a, "\"", 1);
    gram_push_ref(c->b, a, body);
    gram_push_bytes(c->b, a, "\"", 1);
    if (min == 0 && max < 0)
        c->string = r;
    return r;
}

static int digits(struct jc *c, int min, int max)
{
    return gram_repeat(c->b, rule_class(c, cls_range('0', '9')), -1, min, max);
}

/* -?(0|[1-9][0-9]{0,19}) */
static int integer_rule(struct jc *c)
{
    if (c->integer >= 0)
        return c->integer;
    struct gram_builder *b = c->b;
    int nat = gram_rule(b);
    gram_push_bytes(b, gram_alt(b, nat), "0", 1);
    int a = gram_alt(b, nat);
    struct gram_class d19 = cls_range('1', '9');
    gram_push_class(b, a, &d19);
    gram_push_ref(b, a, digits(c, 0, 19));
    int r = gram_rule(b);
    gram_push_ref(b, gram_alt(b, r), nat);
    a = gram_alt(b, r);
    gram_push_bytes(b, a, "-", 1);
    gram_push_ref(b, a, nat);
    return c->integer = r;
}

/* integer (\.[0-9]{1,20})? ([eE][+-]?[0-9]{1,3})? */
static int number_rule(struct jc *c)
{
    if (c->number >= 0)
        return c->number;
    struct gram_builder *b = c->b;
    int frac = gram_rule(b);
    gram_alt(b, frac);
    int a = gram_alt(b, frac);
    gram_push_bytes(b, a, ".", 1);
    gram_push_ref(b, a, digits(c, 1, 20));
    int sign = gram_rule(b);
    gram_alt(b, sign);
    struct gram_class pm = cls_range('+', '+');
    gram_class_range(&pm, '-', '-');
    gram_push_class(b, gram_alt(b, sign), &pm);
    int exp = gram_rule(b);
    gram_alt(b, exp);
    a = gram_alt(b, exp);
    struct gram_class ee = cls_range('e', 'e');
    gram_class_range(&ee, 'E', 'E');
    gram_push_class(b, a, &ee);
    gram_push_ref(b, a, sign);
    gram_push_ref(b, a, digits(c, 1, 3));
    int r = gram_rule(b);
    a = gram_alt(b, r);
    gram_push_ref(b, a, integer_rule(c));
    gram_push_ref(b, a, frac);
    gram_push_ref(b, a, exp);
    return c->number = r;
}

static int literal(struct jc *c, const char *s)
{
    return gram_rule_bytes(c->b, s, strlen(s));
}

static int value_rule(struct jc *c);

/* "{" ws (member ("," ws member)*)? "}" with member = string ws ":" ws value ws; any keys. */
static int object_any_rule(struct jc *c)
{
    if (!jc_ok(c)) /* a failed builder hands out no rules: these refer to each other */
        return -1;
    if (c->object_any >= 0)
        return c->object_any;
    struct gram_builder *b = c->b;
    int r = c->object_any = gram_rule(b); /* made first: values inside refer back to it */
    int mem = gram_rule(b);
    int a = gram_alt(b, mem);
    gram_push_ref(b, a, string_rule(c, 0, -1));
    gram_push_ref(b, a, ws_rule(c));
    gram_push_bytes(b, a, ":", 1);
    gram_push_ref(b, a, ws_rule(c));
    gram_push_ref(b, a, value_rule(c));
    gram_push_ref(b, a, ws_rule(c));
    int sep = gram_rule(b);
    a = gram_alt(b, sep);
    gram_push_bytes(b, a, ",", 1);
    gram_push_ref(b, a, ws_rule(c));
    int list = gram_repeat(b, mem, sep, 0, -1);
    a = gram_alt(b, r);
    gram_push_bytes(b, a, "{", 1);
    gram_push_ref(b, a, ws_rule(c));
    gram_push_ref(b, a, list);
    gram_push_bytes(b, a, "}", 1);
    return r;
}

/* "[" ws (item ws ("," ws item ws){min-1, max-1})? "]" with items given as one rule. */
static int array_of(struct jc *c, int item, int min, int max)
{
    struct gram_builder *b = c->b;
    int it = rule_seq2(c, item, ws_rule(c));
    int sep = gram_rule(b);
    int a = gram_alt(b, sep);
    gram_push_bytes(b, a, ",", 1);
    gram_push_ref(b, a, ws_rule(c));
    int list = gram_repeat(b, it, sep, min, max);
    int r = gram_rule(b);
    a = gram_alt(b, r);
    gram_push_bytes(b, a, "[", 1);
    gram_push_ref(b, a, ws_rule(c));
    gram_push_ref(b, a, list);
    gram_push_bytes(b, a, "]", 1);
    return r;
}

static int array_any_rule(struct jc *c)
{
    if (!jc_ok(c)) /* a failed builder hands out no rules: these refer to each other */
        return -1;
    if (c->array_any >= 0)
        return c->array_any;
    int r = c->array_any = gram_rule(c->b);
    int inner = array_of(c, value_rule(c), 0, -1);
    gram_push_ref(c->b, gram_alt(c->b, r), inner);
    return r;
}

/* Any JSON value. */
static int value_rule(struct jc *c)
{
    if (!jc_ok(c)) /* a failed builder hands out no rules: these refer to each other */
        return -1;
    if (c->value >= 0)
        return c->value;
    struct gram_builder *b = c->b;
    int r = c->value = gram_rule(b);
    int parts[] = {object_any_rule(c), array_any_rule(c), string_rule(c, 0, -1), number_rule(c), literal(c, "true"),
                   literal(c, "false"), literal(c, "null")};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        gram_push_ref(b, gram_alt(b, r), parts[i]);
    return r;
}

/* ---- string formats ---- */

/* Appends to alternative a: n bytes of class k. */
static void push_n(struct jc *c, int a, struct gram_class k, int n)
{
    for (int i = 0; i < n; i++)
        gram_push_class(c->b, a, &k);
}

/* Two-digit fields: 0[1-9]|1[0-2] (month), 0[1-9]|[12][0-9]|3[01] (day), [01][0-9]|2[0-3] (hour). */
static int two_digits(struct jc *c, const char *const *alts, int n)
{
    int r = gram_rule(c->b);
    for (int i = 0; i < n; i++) {
        int a = gram_alt(c->b, r);
        for (int k = 0; k < 2; k++) {
            struct gram_class x = cls_range((unsigned char)alts[i][2 * k], (unsigned char)alts[i][2 * k + 1]);
            gram_push_class(c->b, a, &x);
        }
    }
    return r;
}

static int date_body(struct jc *c)
{
    static const char *const month[] = {"0019", "1102"}, *const day[] = {"0019", "1209", "3301"};
    int r = gram_rule(c->b);
    int a = gram_alt(c->b, r);
    push_n(c, a, cls_range('0', '9'), 4);
    gram_push_bytes(c->b, a, "-", 1);
    gram_push_ref(c->b, a, two_digits(c, month, 2));
    gram_push_bytes(c->b, a, "-", 1);
    gram_push_ref(c->b, a, two_digits(c, day, 3));
    return r;
}

static int time_body(struct jc *c)
{
    static const char *const hour[] = {"0109", "2203"}, *const min[] = {"0509"};
    struct gram_builder *b = c->b;
    int hh = two_digits(c, hour, 2), mm = two_digits(c, min, 1);
    int frac = gram_rule(b);
    gram_alt(b, frac);
    int a = gram_alt(b, frac);
    gram_push_bytes(b, a, ".", 1);
    gram_push_ref(b, a, digits(c, 1, 9));
    int zone = gram_rule(b);
    gram_push_bytes(b, gram_alt(b, zone), "Z", 1);
    a = gram_alt(b, zone);
    struct gram_class pm = cls_range('+', '+');
    gram_class_range(&pm, '-', '-');
    gram_push_class(b, a, &pm);
    gram_push_ref(b, a, hh);
    gram_push_bytes(b, a, ":", 1);
    gram_push_ref(b, a, mm);
    int r = gram_rule(b);
    a = gram_alt(b, r);
    gram_push_ref(b, a, hh);
    gram_push_bytes(b, a, ":", 1);
    gram_push_ref(b, a, mm);
    gram_push_bytes(b, a, ":", 1);
    gram_push_ref(b, a, mm);
    gram_push_ref(b, a, frac);
    gram_push_ref(b, a, zone);
    return r;
}

static int uuid_body(struct jc *c)
{
    struct gram_class hex = cls_range('0', '9');
    gram_class_range(&hex, 'a', 'f');
    gram_class_range(&hex, 'A', 'F');
    int r = gram_rule(c->b);
    int a = gram_alt(c->b, r);
    static const int groups[] = {8, 4, 4, 4, 12};
    for (int i = 0; i < 5; i++) {
        if (i)
            gram_push_bytes(c->b, a, "-", 1);
        push_n(c, a, hex, groups[i]);
    }
    return r;
}

/* local@label(.label)+: local of RFC 5322's atext and dots, labels of letters, digits and '-'. Lengths
 * are not bounded (RFC 5321's 64 / 63): a chain of counted states would make every mask inside an
 * address a fresh walk of the vocabulary, where a loop is walked once. */
static int email_body(struct jc *c)
{
    struct gram_class atext = cls_range('a', 'z');
    gram_class_range(&atext, 'A', 'Z');
    gram_class_range(&atext, '0', '9');
    for (const char *s = "!#$%&'*+/=?^_`{|}~.-"; *s; s++)
        gram_class_range(&atext, (unsigned char)*s, (unsigned char)*s);
    struct gram_class lab = cls_range('a', 'z');
    gram_class_range(&lab, 'A', 'Z');
    gram_class_range(&lab, '0', '9');
    gram_class_range(&lab, '-', '-');
    struct gram_builder *b = c->b;
    int local = gram_repeat(b, rule_class(c, atext), -1, 1, -1);
    int label = gram_repeat(b, rule_class(c, lab), -1, 1, -1);
    int dot_label = gram_rule(b);
    int a = gram_alt(b, dot_label);
    gram_push_bytes(b, a, ".", 1);
    gram_push_ref(b, a, label);
    int r = gram_rule(b);
    a = gram_alt(b, r);
    gram_push_ref(b, a, local);
    gram_push_bytes(b, a, "@", 1);
    gram_push_ref(b, a, label);
    gram_push_ref(b, a, gram_repeat(b, dot_label, -1, 1, -1));
    return r;
}

static int quoted(struct jc *c, int body)
{
    int r = gram_rule(c->b);
    int a = gram_alt(c->b, r);
    gram_push_bytes(c->b, a, "\"", 1);
    gram_push_ref(c->b, a, body);
    gram_push_bytes(c->b, a, "\"", 1);
    return r;
}

/* ---- keywords ---- */

static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "strict", "deprecated", "readOnly", "writeOnly", "$anchor", "name"};
static const char *const KNOWN[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                    "items", "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "$ref",
                                    "$defs", "definitions", "minLength", "maxLength", "format", "nullable",
                                    "pattern"};

static bool in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0)
            return true;
    return false;
}
#define IN_LIST(k, l) in_list(k, l, sizeof l / sizeof l[0])

/* A non-negative integer keyword (absent: dflt). */
static int get_count(struct jc *c, const struct json *s, const char *key, int dflt)
{
    const struct json *j = json_get(s, key);
    if (!j)
        return dflt;
    double v = json_number(j);
    if (!json_is_number(j) || v < 0 || v != (double)(long long)v)
        return jc_fail(c, STATUS_INVALID, "'%s' must be a non-negative integer", key), 0;
    if (v > JC_MAX_COUNT)
        return jc_fail(c, STATUS_INVALID, "'%s' %.0f is larger than this server takes (%d)", key, v, JC_MAX_COUNT), 0;
    return (int)v;
}

static int compile(struct jc *c, const struct json *s);
static int string_text(struct jc *c, const struct json *s);

/* An enum value or const: its JSON text, compact. */
static int json_literal(struct jc *c, const struct json *v)
{
    char *t = json_print(v, false);
    if (!t)
        return jc_fail(c, STATUS_NOMEM, "out of memory");
    int r = gram_rule_bytes(c->b, t, strlen(t));
    free(t);
    return r;
}

static int compile_enum(struct jc *c, const struct json *e)
{
    if (!json_is_array(e) || json_array_size(e) == 0)
        return jc_fail(c, STATUS_INVALID, "'enum' must be a non-empty array");
    int r = gram_rule(c->b);
    for (const struct json *v = json_child(e); v && jc_ok(c); v = json_next(v))
        gram_push_ref(c->b, gram_alt(c->b, r), json_literal(c, v));
    return r;
}

static int compile_string(struct jc *c, const struct json *s)
{
    int min = get_count(c, s, "minLength", 0), max = get_count(c, s, "maxLength", -1);
    if (!jc_ok(c))
        return -1;
    if (max >= 0 && max < min)
        return jc_fail(c, STATUS_INVALID, "'maxLength' %d is below 'minLength' %d", max, min);
    if (!json_get(s, "format") && !json_get(s, "pattern"))
        return string_rule(c, min, max);
    int body = string_text(c, s);
    return body < 0 ? -1 : quoted(c, body);
}

/* The text of a string with a format or a pattern, without its quotes (s has one of them). */
static int string_text(struct jc *c, const struct json *s)
{
    const struct json *f = json_get(s, "format"), *pat = json_get(s, "pattern");
    if (pat) {
        if (!json_is_string(pat))
            return jc_fail(c, STATUS_INVALID, "'pattern' must be a string");
        if (f || json_get(s, "minLength") || json_get(s, "maxLength"))
            return jc_fail(c, STATUS_UNSUPPORTED, "'pattern' together with 'format', 'minLength' or 'maxLength' is not "
                           "supported");
        struct err rerr = {0};
        int body = grammar_regex_rule(c->b, json_string(pat), utf8_rule(c), &rerr);
        if (body < 0)
            return jc_fail(c, rerr.code ? rerr.code : STATUS_INVALID, "%s", rerr.msg);
        return body;
    }
    if (!json_is_string(f))
        return jc_fail(c, STATUS_INVALID, "'format' must be a string");
    if (json_get(s, "minLength") || json_get(s, "maxLength"))
        return jc_fail(c, STATUS_UNSUPPORTED, "'format' together with 'minLength'/'maxLength' is not supported");
    const char *fm = json_string(f);
    if (strcmp(fm, "date") == 0)
        return date_body(c);
    if (strcmp(fm, "time") == 0)
        return time_body(c);
    if (strcmp(fm, "date-time") == 0) {
        int r = gram_rule(c->b);
        int a = gram_alt(c->b, r);
        gram_push_ref(c->b, a, date_body(c));
        gram_push_bytes(c->b, a, "T", 1);
        gram_push_ref(c->b, a, time_body(c));
        return r;
    }
    if (strcmp(fm, "uuid") == 0)
        return uuid_body(c);
    if (strcmp(fm, "email") == 0)
        return email_body(c);
    return jc_fail(c, STATUS_UNSUPPORTED, "'format' \"%.64s\" is not supported (date, time, date-time, uuid, email are)",
                   fm);
}

static int compile_array(struct jc *c, const struct json *s)
{
    int min = get_count(c, s, "minItems", 0), max = get_count(c, s, "maxItems", -1);
    if (!jc_ok(c))
        return -1;
    if (max >= 0 && max < min)
        return jc_fail(c, STATUS_INVALID, "'maxItems' %d is below 'minItems' %d", max, min);
    const struct json *items = json_get(s, "items"), *prefix = json_get(s, "prefixItems");
    if (prefix && (!json_is_array(prefix) || json_array_size(prefix) == 0))
        return jc_fail(c, STATUS_INVALID, "'prefixItems' must be a non-empty array of schemas");
    if (items && !json_is_object(items) && !json_is_bool(items))
        return jc_fail(c, STATUS_INVALID, "'items' must be a schema");
    bool items_none = items && json_is_bool(items) && !json_bool(items);
    if (items_none && !prefix)
        max = 0;
    int item = -1;
    if (!items_none) {
        size_t at = path_push(c, "%s", ".items");
        item = items && json_is_object(items) ? compile(c, items) : value_rule(c);
        path_pop(c, at);
    }
    if (!prefix)
        return array_of(c, item >= 0 ? item : value_rule(c), min, max);
    /* prefixItems: "[" ws p1 ws ("," ws p2 ws ( ... ("," ws item ws)*)?)? "]" with minItems/maxItems over all */
    int np = (int)json_array_size(prefix);
    if (max >= 0 && max < np)
        return jc_fail(c, STATUS_UNSUPPORTED, "'maxItems' below the number of 'prefixItems' is not supported");
    struct gram_builder *b = c->b;
    int ws = ws_rule(c);
    /* the tail after the prefix: ("," ws item ws){min', max'} */
    int tail;
    if (item < 0) {
        tail = gram_rule(b);
        gram_alt(b, tail);
    } else {
        int one = gram_rule(b);
        int a = gram_alt(b, one);
        gram_push_bytes(b, a, ",", 1);
        gram_push_ref(b, a, ws);
        gram_push_ref(b, a, item);
        gram_push_ref(b, a, ws);
        int tmin = min > np ? min - np : 0, tmax = max < 0 ? -1 : max - np;
        tail = gram_repeat(b, one, -1, tmin, tmax);
    }
    if (min > np && item < 0)
        return jc_fail(c, STATUS_INVALID, "'minItems' %d needs more than the %d 'prefixItems' and 'items' is false", min,
                       np);
    /* from the last prefix item back: P_i = "," ws p_i ws P_{i+1}, or the end when i >= min */
    int next = tail;
    for (int i = np - 1; i >= 0 && jc_ok(c); i--) {
        char idx[24];
        snprintf(idx, sizeof idx, ".prefixItems[%d]", i);
        size_t at = path_push(c, "%s", idx);
        int pi = compile(c, json_array_at(prefix, (size_t)i));
        path_pop(c, at);
        int r = gram_rule(b);
        int a = gram_alt(b, r);
        if (i > 0) {
            gram_push_bytes(b, a, ",", 1);
            gram_push_ref(b, a, ws);
        }
        gram_push_ref(b, a, pi);
        gram_push_ref(b, a, ws);
        gram_push_ref(b, a, next);
        if (i >= min)
            gram_alt(b, r); /* the array may stop before item i */
        next = r;
    }
    int r = gram_rule(b);
    int a = gram_alt(b, r);
    gram_push_bytes(b, a, "[", 1);
    gram_push_ref(b, a, ws);
    gram_push_ref(b, a, next);
    gram_push_bytes(b, a, "]", 1);
    return r;
}

/* member = "key" ws ":" ws value ws */
static int member_rule(struct jc *c, int key, int value)
{
    int r = gram_rule(c->b);
    int a = gram_alt(c->b, r);
    gram_push_ref(c->b, a, key);
    gram_push_ref(c->b, a, ws_rule(c));
    gram_push_bytes(c->b, a, ":", 1);
    gram_push_ref(c->b, a, ws_rule(c));
    gram_push_ref(c->b, a, value);
    gram_push_ref(c->b, a, ws_rule(c));
    return r;
}

static int compile_object(struct jc *c, const struct json *s)
{
    struct gram_builder *b = c->b;
    const struct json *props = json_get(s, "properties"), *req = json_get(s, "required");
    const struct json *addl = json_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return jc_fail(c, STATUS_INVALID, "'properties' must be an object");
    if (req && !json_is_array(req))
        return jc_fail(c, STATUS_INVALID, "'required' must be an array of property names");
    for (const struct json *k = json_child(req); k; k = json_next(k)) {
        if (!json_is_string(k))
            return jc_fail(c, STATUS_INVALID, "'required' must be an array of property names");
        if (!json_get(props, json_string(k)))
            return jc_fail(c, STATUS_UNSUPPORTED, "'required' names \"%.64s\", which 'properties' does not define",
                           json_string(k));
    }
    if (addl && !json_is_bool(addl) && !json_is_object(addl))
        return jc_fail(c, STATUS_INVALID, "'additionalProperties' must be a boolean or a schema");
    /* other keys: any string key, a value of the additionalProperties schema */
    int extra = -1;
    if (!addl && !props) { /* {"type": "object"} alone: any object */
        extra = member_rule(c, string_rule(c, 0, -1), value_rule(c));
    } else if (addl && !(json_is_bool(addl) && !json_bool(addl))) {
        size_t at = path_push(c, "%s", ".additionalProperties");
        int v = json_is_object(addl) ? compile(c, addl) : value_rule(c);
        path_pop(c, at);
        extra = member_rule(c, string_rule(c, 0, -1), v);
    }
    /* A_{n+1}, B_{n+1}: the end, or the other keys */
    int an = gram_rule(b), bn = gram_rule(b);
    gram_alt(b, an);
    gram_alt(b, bn);
    if (extra >= 0) { /* A ::= extra X | empty; B ::= "," ws extra X | empty; X ::= ("," ws extra)* */
        int sep_extra = gram_rule(b);
        int a = gram_alt(b, sep_extra);
        gram_push_bytes(b, a, ",", 1);
        gram_push_ref(b, a, ws_rule(c));
        gram_push_ref(b, a, extra);
        int more = gram_repeat(b, sep_extra, -1, 0, -1);
        a = gram_alt(b, an);
        gram_push_ref(b, a, extra);
        gram_push_ref(b, a, more);
        a = gram_alt(b, bn);
        gram_push_ref(b, a, sep_extra);
        gram_push_ref(b, a, more);
    }
    int n = 0;
    for (const struct json *p = json_child(props); p; p = json_next(p))
        n++;
    const struct json **list = calloc((size_t)(n ? n : 1), sizeof *list);
    if (!list)
        return jc_fail(c, STATUS_NOMEM, "out of memory");
    n = 0;
    for (const struct json *p = json_child(props); p; p = json_next(p))
        list[n++] = p;
    int ai = an, bi = bn;
    for (int i = n - 1; i >= 0 && jc_ok(c); i--) {
        const char *name = json_key(list[i]);
        size_t at = path_push(c, ".properties.%.64s", name);
        int v = compile(c, list[i]);
        path_pop(c, at);
        struct json *ks = json_new_string(name);
        char *kt = ks ? json_print(ks, false) : NULL;
        int key = kt ? gram_rule_bytes(b, kt, strlen(kt)) : jc_fail(c, STATUS_NOMEM, "out of memory");
        free(kt);
        json_free(ks);
        int m = member_rule(c, key, v);
        bool required = false;
        for (const struct json *k = json_child(req); k && !required; k = json_next(k))
            required = strcmp(json_string(k), name) == 0;
        int na = gram_rule(b), nb = gram_rule(b);
        int a = gram_alt(b, na);
        gram_push_ref(b, a, m);
        gram_push_ref(b, a, bi);
        a = gram_alt(b, nb);
        gram_push_bytes(b, a, ",", 1);
        gram_push_ref(b, a, ws_rule(c));
        gram_push_ref(b, a, m);
        gram_push_ref(b, a, bi);
        if (!required) {
            gram_push_ref(b, gram_alt(b, na), ai);
            gram_push_ref(b, gram_alt(b, nb), bi);
        }
        ai = na, bi = nb;
    }
    free(list);
    int r = gram_rule(b);
    int a = gram_alt(b, r);
    gram_push_bytes(b, a, "{", 1);
    gram_push_ref(b, a, ws_rule(c));
    gram_push_ref(b, a, ai);
    gram_push_bytes(b, a, "}", 1);
    return r;
}

/* A $ref's target: "#", "#/$defs/NAME", "#/definitions/NAME" (JSON pointer escapes ~0 ~1). */
static const struct json *resolve_ref(struct jc *c, const char *ref)
{
    if (strcmp(ref, "#") == 0)
        return c->root;
    const char *name = NULL, *where = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0)
        name = ref + 8, where = "$defs";
    else if (strncmp(ref, "#/definitions/", 14) == 0)
        name = ref + 14, where = "definitions";
    if (!name || strchr(name, '/')) {
        jc_fail(c, STATUS_UNSUPPORTED, "'$ref' \"%.100s\" is not supported (\"#\", \"#/$defs/NAME\" and "
                "\"#/definitions/NAME\" are)", ref);
        return NULL;
    }
    char key[256];
    size_t n = 0;
    for (const char *p = name; *p && n + 1 < sizeof key; p++) {
        if (p[0] == '~' && p[1] == '0')
            key[n++] = '~', p++;
        else if (p[0] == '~' && p[1] == '1')
            key[n++] = '/', p++;
        else
            key[n++] = *p;
    }
    key[n] = 0;
    const struct json *t = json_get(json_get(c->root, where), key);
    if (!t)
        jc_fail(c, STATUS_INVALID, "'$ref' \"%.100s\" names nothing", ref);
    return t;
}

static int memo_get(const struct jc *c, const struct json *s)
{
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo[i].schema == s)
            return c->memo[i].rule;
    return -1;
}

static int type_rule(struct jc *c, const struct json *s, const char *t)
{
    if (strcmp(t, "object") == 0)
        return compile_object(c, s);
    if (strcmp(t, "array") == 0)
        return compile_array(c, s);
    if (strcmp(t, "string") == 0)
        return compile_string(c, s);
    if (strcmp(t, "number") == 0)
        return number_rule(c);
    if (strcmp(t, "integer") == 0)
        return integer_rule(c);
    if (strcmp(t, "boolean") == 0) {
        if (c->boolean < 0) {
            c->boolean = gram_rule(c->b);
            gram_push_ref(c->b, gram_alt(c->b, c->boolean), literal(c, "true"));
            gram_push_ref(c->b, gram_alt(c->b, c->boolean), literal(c, "false"));
        }
        return c->boolean;
    }
    if (strcmp(t, "null") == 0)
        return c->null >= 0 ? c->null : (c->null = literal(c, "null"));
    return jc_fail(c, STATUS_INVALID, "'type' \"%.32s\" is not a JSON Schema type", t);
}

/* The body of schema s (a new rule's alternatives go to r). */
static void compile_body(struct jc *c, const struct json *s, int r)
{
    struct gram_builder *b = c->b;
    if (json_is_bool(s)) {
        if (!json_bool(s))
            jc_fail(c, STATUS_UNSUPPORTED, "the schema false (no value) is not supported");
        else
            gram_push_ref(b, gram_alt(b, r), value_rule(c));
        return;
    }
    if (!json_is_object(s)) {
        jc_fail(c, STATUS_INVALID, "a schema must be an object or a boolean");
        return;
    }
    for (const struct json *k = json_child(s); k; k = json_next(k)) {
        const char *key = json_key(k);
        if (!IN_LIST(key, KNOWN) && !IN_LIST(key, ANNOTATIONS)) {
            jc_fail(c, STATUS_UNSUPPORTED, "'%.64s' is not supported", key);
            return;
        }
    }
    const struct json *ref = json_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) {
            jc_fail(c, STATUS_INVALID, "'$ref' must be a string");
            return;
        }
        for (const struct json *k = json_child(s); k; k = json_next(k))
            if (IN_LIST(json_key(k), KNOWN) && strcmp(json_key(k), "$ref") && strcmp(json_key(k), "$defs") &&
                strcmp(json_key(k), "definitions")) {
                jc_fail(c, STATUS_UNSUPPORTED, "'%.64s' beside '$ref' is not supported", json_key(k));
                return;
            }
        size_t at = path_push(c, ".$ref(%.100s)", json_string(ref));
        const struct json *t = resolve_ref(c, json_string(ref));
        int tr = t ? compile(c, t) : -1;
        path_pop(c, at);
        gram_push_ref(b, gram_alt(b, r), tr);
        return;
    }
    const struct json *any = json_get(s, "anyOf"), *one = json_get(s, "oneOf");
    if (any && one) {
        jc_fail(c, STATUS_UNSUPPORTED, "'anyOf' and 'oneOf' together are not supported");
        return;
    }
    if (one)
        any = one;
    if (any) {
        const char *kw = one ? "oneOf" : "anyOf";
        if (!json_is_array(any) || json_array_size(any) == 0) {
            jc_fail(c, STATUS_INVALID, "'%s' must be a non-empty array of schemas", kw);
            return;
        }
        for (const struct json *k = json_child(s); k; k = json_next(k))
            if (IN_LIST(json_key(k), KNOWN) && strcmp(json_key(k), kw) && strcmp(json_key(k), "$defs") &&
                strcmp(json_key(k), "definitions")) {
                jc_fail(c, STATUS_UNSUPPORTED, "'%.64s' beside '%s' is not supported", json_key(k), kw);
                return;
            }
        int i = 0;
        for (const struct json *x = json_child(any); x && jc_ok(c); x = json_next(x), i++) {
            char idx[32];
            snprintf(idx, sizeof idx, ".%s[%d]", kw, i);
            size_t at = path_push(c, "%s", idx);
            int xr = compile(c, x);
            path_pop(c, at);
            gram_push_ref(b, gram_alt(b, r), xr);
        }
        return;
    }
    const struct json *en = json_get(s, "enum"), *cn = json_get(s, "const");
    if (en || cn) {
        if (en && cn) {
            jc_fail(c, STATUS_UNSUPPORTED, "'enum' and 'const' together are not supported");
            return;
        }
        gram_push_ref(b, gram_alt(b, r), en ? compile_enum(c, en) : json_literal(c, cn));
        return;
    }
    const struct json *type = json_get(s, "type");
    const struct json *nullable = json_get(s, "nullable");
    if (nullable && !json_is_bool(nullable)) {
        jc_fail(c, STATUS_INVALID, "'nullable' must be a boolean");
        return;
    }
    bool has_null = false;
    if (!type) { /* the type from the keywords, else any value */
        const char *t = json_get(s, "properties") || json_get(s, "required") || json_get(s, "additionalProperties")
                            ? "object"
                        : json_get(s, "items") || json_get(s, "prefixItems") ? "array"
                        : json_get(s, "minLength") || json_get(s, "maxLength") || json_get(s, "format") ||
                                  json_get(s, "pattern")
                            ? "string"
                                                                                                         : NULL;
        gram_push_ref(b, gram_alt(b, r), t ? type_rule(c, s, t) : value_rule(c));
    } else if (json_is_string(type)) {
        gram_push_ref(b, gram_alt(b, r), type_rule(c, s, json_string(type)));
        has_null = strcmp(json_string(type), "null") == 0;
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        for (const struct json *t = json_child(type); t && jc_ok(c); t = json_next(t)) {
            if (!json_is_string(t)) {
                jc_fail(c, STATUS_INVALID, "'type' must be a type name or an array of them");
                return;
            }
            gram_push_ref(b, gram_alt(b, r), type_rule(c, s, json_string(t)));
            has_null |= strcmp(json_string(t), "null") == 0;
        }
    } else {
        jc_fail(c, STATUS_INVALID, "'type' must be a type name or an array of them");
        return;
    }
    if (json_bool(nullable) && !has_null)
        gram_push_ref(b, gram_alt(b, r), type_rule(c, s, "null"));
}

static int compile(struct jc *c, const struct json *s)
{
    if (!jc_ok(c))
        return -1;
    int r = memo_get(c, s);
    if (r >= 0)
        return r;
    if (c->depth >= GRAMMAR_JSON_MAX_DEPTH)
        return jc_fail(c, STATUS_INVALID, "the schema nests deeper than %d levels", GRAMMAR_JSON_MAX_DEPTH);
    if (c->n_memo >= JC_MAX_MEMO)
        return jc_fail(c, STATUS_INVALID, "the schema has more than %d subschemas", JC_MAX_MEMO);
    if (c->n_memo == c->cap_memo) {
        int nc = c->cap_memo ? 2 * c->cap_memo : 32;
        struct jc_memo *m = realloc(c->memo, (size_t)nc * sizeof *m);
        if (!m)
            return jc_fail(c, STATUS_NOMEM, "out of memory");
        c->memo = m, c->cap_memo = nc;
    }
    r = gram_rule(c->b); /* registered before its body: a $ref back to s refers to r */
    c->memo[c->n_memo++] = (struct jc_memo){s, r};
    c->depth++;
    compile_body(c, s, r);
    c->depth--;
    return jc_ok(c) ? r : -1;
}

static void jc_init(struct jc *c, struct gram_builder *b, const struct grammar_json_opts *o, struct err *err)
{
    *c = (struct jc){.b = b, .ws_max = o && o->ws_max ? o->ws_max : GRAMMAR_JSON_WS_MAX, .err = err};
    c->ws = c->value = c->string = c->number = c->integer = c->boolean = c->null = c->str_char = c->object_any =
        c->array_any = c->utf8 = -1;
}

enum status grammar_json_compile(const struct grammar_json_part *parts, int n_parts, const struct grammar_json_opts *o,
                                 struct grammar **out, struct err *err)
{
    *out = NULL;
    struct gram_builder own;
    struct jc c;
    jc_init(&c, &own, o, err);
    gram_builder_init(c.b);
    const char *name = o && o->path ? o->path : "schema";
    if (n_parts < 1)
        return err_set(err, STATUS_INVALID, "%s: no parts to compile", name);
    int root = gram_rule(c.b);
    for (int i = 0; i < n_parts && jc_ok(&c); i++) {
        c.root = parts[i].schema;
        c.n_memo = 0; /* schemas of different parts are different documents */
        c.path_len = 0;
        path_push(&c, "%s", name);
        if (n_parts > 1) {
            char idx[24];
            snprintf(idx, sizeof idx, "[%d]", i);
            path_push(&c, "%s", idx);
        }
        int v = parts[i].schema ? compile(&c, parts[i].schema) : object_any_rule(&c);
        int a = gram_alt(c.b, root);
        if (parts[i].prefix)
            gram_push_bytes(c.b, a, parts[i].prefix, strlen(parts[i].prefix));
        gram_push_ref(c.b, a, v);
        if (parts[i].suffix)
            gram_push_bytes(c.b, a, parts[i].suffix, strlen(parts[i].suffix));
    }
    free(c.memo);
    if (c.st) {
        gram_builder_free(c.b);
        return c.st;
    }
    enum status st = gram_builder_finish(c.b, root, out, err);
    if (st)
        err_prefix(err, "%s", name);
    return st;
}

enum status grammar_json_compile_text(const char *schema, size_t len, const struct grammar_json_opts *o,
                                      struct grammar **out, struct err *err)
{
    *out = NULL;
    const char *name = o && o->path ? o->path : "schema";
    struct json *j = NULL;
    if (schema) {
        enum status st = json_parse(schema, len, name, &j, err);
        if (st)
            return st;
        const char *dup = json_duplicate_key(j);
        if (dup) {
            st = err_set(err, STATUS_INVALID, "%s: the key \"%.64s\" appears twice in one object", name, dup);
            json_free(j); /* dup points into j */
            return st;
        }
    }
    struct grammar_json_part p = {.schema = j};
    enum status st = grammar_json_compile(&p, 1, o, out, err);
    json_free(j);
    return st;
}

/* ---- schemas inside another grammar ---- */

struct grammar_json_sub {
    struct jc c;
};

enum status grammar_json_sub_init(struct grammar_json_sub **out, struct gram_builder *b,
                                  const struct grammar_json_opts *o, struct err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return err_set(err, STATUS_NOMEM, "out of memory");
    jc_init(&(*out)->c, b, o, err);
    return STATUS_OK;
}

void grammar_json_sub_free(struct grammar_json_sub *sub)
{
    if (!sub)
        return;
    free(sub->c.memo);
    free(sub);
}

/* Points c at schema's document and path; a new document drops the rules memoised for the last
 * (their $refs meant another root). */
static void sub_enter(struct jc *c, const struct json *root, const char *path)
{
    if (c->root != root)
        c->n_memo = 0;
    c->root = root;
    c->path_len = 0;
    c->path[0] = 0;
    path_push(c, "%s", path ? path : "schema");
}

enum status grammar_json_sub_value(struct grammar_json_sub *sub, const struct json *root, const struct json *schema,
                                   const char *path, int *rule)
{
    struct jc *c = &sub->c;
    sub_enter(c, root, path);
    *rule = schema ? compile(c, schema) : value_rule(c);
    return c->st;
}

enum status grammar_json_sub_format_text(struct grammar_json_sub *sub, const struct json *root,
                                         const struct json *schema, const char *path, int *rule)
{
    struct jc *c = &sub->c;
    sub_enter(c, root, path);
    *rule = -1;
    if (!json_get(schema, "format"))
        return jc_fail(c, STATUS_INVALID, "no 'format'"), c->st;
    if (json_get(schema, "pattern")) /* grammar_regex matches JSON-escaped text, not the characters */
        return jc_fail(c, STATUS_UNSUPPORTED, "'pattern' is not supported here (only in JSON strings)"), c->st;
    *rule = string_text(c, schema);
    return c->st;
}

int grammar_json_sub_utf8(struct grammar_json_sub *sub)
{
    return jc_ok(&sub->c) ? utf8_rule(&sub->c) : -1;
}

bool grammar_json_is_annotation(const char *key)
{
    return IN_LIST(key, ANNOTATIONS);
}
