/* jinja_builtins.c — filters, tests, global functions and value methods of
 * the chat-template interpreter (see jinja_builtins.h).
 *
 * Each builtin reproduces what jinja2 3.1 (filters.py, tests.py, defaults,
 * sandbox) or CPython does with the same arguments, including its quirks:
 * `default` only replaces Undefined unless boolean=true, `title` is jinja2's
 * word-start rule (the str.title method is Python's), `round` rounds half to
 * even, `int` falls back through float, string filters stringify their input,
 * `sort`/`unique`/`min`/`max` ignore case unless told otherwise.
 * Not here: groupby, slice, urlize, wordwrap, xmlattr, pprint, random,
 * filesizeformat, striptags, cycler, joiner, lipsum.
 * One file over 800 lines: the builtins are looked up in one table by name and share the
 * argument-binding helpers; splitting by kind (filters, tests, methods) is the next step.
 */
#include "template/jinja_builtins.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "template/jinja_eval.h"
#include "template/jinja_json.h"
#include "template/jinja_lexer.h"

#define MAXP 8

/* ---- tables ---------------------------------------------------------------------------------- */

enum filter_id {
    F_ABS,
    F_ATTR,
    F_BATCH,
    F_CAPITALIZE,
    F_CENTER,
    F_DEFAULT,
    F_DICTSORT,
    F_ESCAPE,
    F_FIRST,
    F_FLOAT,
    F_FORCEESCAPE,
    F_FORMAT,
    F_INDENT,
    F_INT,
    F_ITEMS,
    F_JOIN,
    F_LAST,
    F_LENGTH,
    F_LIST,
    F_LOWER,
    F_MAP,
    F_MAX,
    F_MIN,
    F_REJECT,
    F_REJECTATTR,
    F_REPLACE,
    F_REVERSE,
    F_ROUND,
    F_SAFE,
    F_SELECT,
    F_SELECTATTR,
    F_SORT,
    F_STRING,
    F_SUM,
    F_TITLE,
    F_TOJSON,
    F_TRIM,
    F_TRUNCATE,
    F_UNIQUE,
    F_UPPER,
    F_WORDCOUNT,
};

static const struct {
    const char *name;
    int id;
} filters[] = {
    {"abs", F_ABS},           {"attr", F_ATTR},
    {"batch", F_BATCH},       {"capitalize", F_CAPITALIZE},
    {"center", F_CENTER},     {"count", F_LENGTH},
    {"d", F_DEFAULT},         {"default", F_DEFAULT},
    {"dictsort", F_DICTSORT}, {"e", F_ESCAPE},
    {"escape", F_ESCAPE},     {"first", F_FIRST},
    {"float", F_FLOAT},       {"forceescape", F_FORCEESCAPE},
    {"format", F_FORMAT},     {"indent", F_INDENT},
    {"int", F_INT},           {"items", F_ITEMS},
    {"join", F_JOIN},         {"last", F_LAST},
    {"length", F_LENGTH},     {"list", F_LIST},
    {"lower", F_LOWER},       {"map", F_MAP},
    {"max", F_MAX},           {"min", F_MIN},
    {"reject", F_REJECT},     {"rejectattr", F_REJECTATTR},
    {"replace", F_REPLACE},   {"reverse", F_REVERSE},
    {"round", F_ROUND},       {"safe", F_SAFE},
    {"select", F_SELECT},     {"selectattr", F_SELECTATTR},
    {"sort", F_SORT},         {"string", F_STRING},
    {"sum", F_SUM},           {"title", F_TITLE},
    {"tojson", F_TOJSON},     {"trim", F_TRIM},
    {"truncate", F_TRUNCATE}, {"unique", F_UNIQUE},
    {"upper", F_UPPER},       {"wordcount", F_WORDCOUNT},
};

enum test_id {
    T_BOOLEAN,
    T_CALLABLE,
    T_DEFINED,
    T_DIVISIBLEBY,
    T_EQ,
    T_ESCAPED,
    T_EVEN,
    T_FALSE,
    T_FILTER,
    T_FLOAT,
    T_GE,
    T_GT,
    T_IN,
    T_INTEGER,
    T_ITERABLE,
    T_LE,
    T_LOWER,
    T_LT,
    T_MAPPING,
    T_NE,
    T_NONE,
    T_NUMBER,
    T_ODD,
    T_SAMEAS,
    T_SEQUENCE,
    T_STRING,
    T_TEST,
    T_TRUE,
    T_UNDEFINED,
    T_UPPER,
};

static const struct {
    const char *name;
    int id;
} tests[] = {
    {"!=", T_NE},
    {"<", T_LT},
    {"<=", T_LE},
    {"==", T_EQ},
    {">", T_GT},
    {">=", T_GE},
    {"boolean", T_BOOLEAN},
    {"callable", T_CALLABLE},
    {"defined", T_DEFINED},
    {"divisibleby", T_DIVISIBLEBY},
    {"eq", T_EQ},
    {"equalto", T_EQ},
    {"escaped", T_ESCAPED},
    {"even", T_EVEN},
    {"false", T_FALSE},
    {"filter", T_FILTER},
    {"float", T_FLOAT},
    {"ge", T_GE},
    {"greaterthan", T_GT},
    {"gt", T_GT},
    {"in", T_IN},
    {"integer", T_INTEGER},
    {"iterable", T_ITERABLE},
    {"le", T_LE},
    {"lessthan", T_LT},
    {"lower", T_LOWER},
    {"lt", T_LT},
    {"mapping", T_MAPPING},
    {"ne", T_NE},
    {"none", T_NONE},
    {"number", T_NUMBER},
    {"odd", T_ODD},
    {"sameas", T_SAMEAS},
    {"sequence", T_SEQUENCE},
    {"string", T_STRING},
    {"test", T_TEST},
    {"true", T_TRUE},
    {"undefined", T_UNDEFINED},
    {"upper", T_UPPER},
};

enum global_id { G_DICT, G_NAMESPACE, G_RAISE_EXCEPTION, G_RANGE, G_STRFTIME_NOW };

static const char *const globals[] = {
    [G_DICT] = "dict",   [G_NAMESPACE] = "namespace",       [G_RAISE_EXCEPTION] = "raise_exception",
    [G_RANGE] = "range", [G_STRFTIME_NOW] = "strftime_now",
};

enum method_id {
    /* str */
    M_CAPITALIZE,
    M_CENTER,
    M_COUNT,
    M_ENDSWITH,
    M_FIND,
    M_FORMAT,
    M_INDEX,
    M_ISALNUM,
    M_ISALPHA,
    M_ISDIGIT,
    M_ISLOWER,
    M_ISSPACE,
    M_ISUPPER,
    M_JOIN,
    M_LJUST,
    M_LOWER,
    M_LSTRIP,
    M_REMOVEPREFIX,
    M_REMOVESUFFIX,
    M_REPLACE,
    M_RFIND,
    M_RJUST,
    M_RSPLIT,
    M_RSTRIP,
    M_SPLIT,
    M_SPLITLINES,
    M_STARTSWITH,
    M_STRIP,
    M_SWAPCASE,
    M_TITLE,
    M_UPPER,
    M_ZFILL,
    /* dict */
    M_D_COPY,
    M_D_GET,
    M_D_ITEMS,
    M_D_KEYS,
    M_D_VALUES,
    /* list */
    M_L_COPY,
    M_L_COUNT,
    M_L_INDEX,
    /* loop */
    M_LOOP_CYCLE,
    M_LOOP_CHANGED,
    M_UNSAFE,
};

struct method_entry {
    const char *name;
    int id;
};

static const struct method_entry str_methods[] = {
    {"capitalize", M_CAPITALIZE},
    {"center", M_CENTER},
    {"count", M_COUNT},
    {"endswith", M_ENDSWITH},
    {"find", M_FIND},
    {"format", M_FORMAT},
    {"index", M_INDEX},
    {"isalnum", M_ISALNUM},
    {"isalpha", M_ISALPHA},
    {"isdigit", M_ISDIGIT},
    {"islower", M_ISLOWER},
    {"isspace", M_ISSPACE},
    {"isupper", M_ISUPPER},
    {"join", M_JOIN},
    {"ljust", M_LJUST},
    {"lower", M_LOWER},
    {"lstrip", M_LSTRIP},
    {"removeprefix", M_REMOVEPREFIX},
    {"removesuffix", M_REMOVESUFFIX},
    {"replace", M_REPLACE},
    {"rfind", M_RFIND},
    {"rjust", M_RJUST},
    {"rsplit", M_RSPLIT},
    {"rstrip", M_RSTRIP},
    {"split", M_SPLIT},
    {"splitlines", M_SPLITLINES},
    {"startswith", M_STARTSWITH},
    {"strip", M_STRIP},
    {"swapcase", M_SWAPCASE},
    {"title", M_TITLE},
    {"upper", M_UPPER},
    {"zfill", M_ZFILL},
};

static const struct method_entry dict_methods[] = {
    {"copy", M_D_COPY},       {"get", M_D_GET},     {"items", M_D_ITEMS},   {"keys", M_D_KEYS},
    {"values", M_D_VALUES},   {"clear", M_UNSAFE},  {"pop", M_UNSAFE},      {"popitem", M_UNSAFE},
    {"setdefault", M_UNSAFE}, {"update", M_UNSAFE}, {"fromkeys", M_UNSAFE},
};

static const struct method_entry list_methods[] = {
    {"copy", M_L_COPY},   {"count", M_L_COUNT},  {"index", M_L_INDEX}, {"append", M_UNSAFE},
    {"clear", M_UNSAFE},  {"extend", M_UNSAFE},  {"insert", M_UNSAFE}, {"pop", M_UNSAFE},
    {"remove", M_UNSAFE}, {"reverse", M_UNSAFE}, {"sort", M_UNSAFE},
};

static const struct method_entry tuple_methods[] = {
    {"count", M_L_COUNT},
    {"index", M_L_INDEX},
};

static const struct method_entry loop_methods[] = {
    {"cycle", M_LOOP_CYCLE},
    {"changed", M_LOOP_CHANGED},
};

static const char *const method_names[] = {
    [M_CAPITALIZE] = "capitalize",
    [M_CENTER] = "center",
    [M_COUNT] = "count",
    [M_ENDSWITH] = "endswith",
    [M_FIND] = "find",
    [M_FORMAT] = "format",
    [M_INDEX] = "index",
    [M_ISALNUM] = "isalnum",
    [M_ISALPHA] = "isalpha",
    [M_ISDIGIT] = "isdigit",
    [M_ISLOWER] = "islower",
    [M_ISSPACE] = "isspace",
    [M_ISUPPER] = "isupper",
    [M_JOIN] = "join",
    [M_LJUST] = "ljust",
    [M_LOWER] = "lower",
    [M_LSTRIP] = "lstrip",
    [M_REMOVEPREFIX] = "removeprefix",
    [M_REMOVESUFFIX] = "removesuffix",
    [M_REPLACE] = "replace",
    [M_RFIND] = "rfind",
    [M_RJUST] = "rjust",
    [M_RSPLIT] = "rsplit",
    [M_RSTRIP] = "rstrip",
    [M_SPLIT] = "split",
    [M_SPLITLINES] = "splitlines",
    [M_STARTSWITH] = "startswith",
    [M_STRIP] = "strip",
    [M_SWAPCASE] = "swapcase",
    [M_TITLE] = "title",
    [M_UPPER] = "upper",
    [M_ZFILL] = "zfill",
    [M_D_COPY] = "copy",
    [M_D_GET] = "get",
    [M_D_ITEMS] = "items",
    [M_D_KEYS] = "keys",
    [M_D_VALUES] = "values",
    [M_L_COPY] = "copy",
    [M_L_COUNT] = "count",
    [M_L_INDEX] = "index",
    [M_LOOP_CYCLE] = "cycle",
    [M_LOOP_CHANGED] = "changed",
    [M_UNSAFE] = "?",
};

int jinja_filter_find(const char *name)
{
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (!strcmp(filters[i].name, name))
            return filters[i].id;
    return -1;
}

int jinja_test_find(const char *name)
{
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (!strcmp(tests[i].name, name))
            return tests[i].id;
    return -1;
}

int jinja_global_find(const char *name)
{
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (!strcmp(globals[i], name))
            return (int)i;
    return -1;
}

static int method_lookup(const struct method_entry *t, size_t count, const char *name, size_t n)
{
    for (size_t i = 0; i < count; i++)
        if (strlen(t[i].name) == n && !memcmp(t[i].name, name, n))
            return t[i].id;
    return -1;
}

int jinja_method_find(const struct jv *self, const char *name, size_t n, bool *unsafe)
{
    int id = -1;
    *unsafe = false;
#define LOOKUP(t) method_lookup(t, sizeof t / sizeof t[0], name, n)
    switch (self->kind) {
    case JV_STR: id = LOOKUP(str_methods); break;
    case JV_DICT: id = LOOKUP(dict_methods); break;
    case JV_LIST:
        if (self->u.l->seq == JV_SEQ_LIST)
            id = LOOKUP(list_methods);
        else if (self->u.l->seq == JV_SEQ_TUPLE)
            id = LOOKUP(tuple_methods);
        break;
    case JV_LOOP: id = LOOKUP(loop_methods); break;
    default: break;
    }
#undef LOOKUP
    if (id == M_UNSAFE)
        *unsafe = true;
    return id;
}

/* ---- argument helpers ------------------------------------------------------------------------ */

/* Binds positional and keyword arguments to parameter slots (NULL = absent). */
static bool bind_args(struct jrender *r, const char *fname, const struct jargs *a, const char *const *names,
                      size_t n, const struct jv **slot)
{
    for (size_t i = 0; i < n; i++)
        slot[i] = NULL;
    if (a->n_pos > n)
        return jr_fail(r, STATUS_INVALID, "%s() takes at most %zu argument(s) (%zu given)", fname, n,
                       a->n_pos);
    for (size_t i = 0; i < a->n_pos; i++)
        slot[i] = &a->pos[i];
    for (size_t k = 0; k < a->n_kw; k++) {
        size_t i = 0;
        while (i < n && strcmp(names[i], a->kw_names[k]) != 0)
            i++;
        if (i == n)
            return jr_fail(r, STATUS_INVALID, "%s() got an unexpected keyword argument '%s'", fname,
                           a->kw_names[k]);
        if (slot[i])
            return jr_fail(r, STATUS_INVALID, "%s() got multiple values for argument '%s'", fname, names[i]);
        slot[i] = &a->kw_vals[k];
    }
    return true;
}

#define BIND(fname, ...)                                                                                     \
    static const char *const pnames_[] = {__VA_ARGS__};                                                      \
    const struct jv *p[sizeof pnames_ / sizeof pnames_[0]];                                                  \
    if (!bind_args(r, fname, args, pnames_, sizeof pnames_ / sizeof pnames_[0], p))                          \
    return false

static bool no_args(struct jrender *r, const char *fname, const struct jargs *a)
{
    if (a->n_pos || a->n_kw)
        return jr_fail(r, STATUS_INVALID, "%s() takes no arguments", fname);
    return true;
}

static bool is_none(const struct jv *v)
{
    return !v || v->kind == JV_NONE;
}

static bool get_int(struct jrender *r, const struct jv *v, int64_t *out)
{
    if (v->kind == JV_INT) {
        *out = v->u.i;
        return true;
    }
    if (v->kind == JV_BOOL) {
        *out = v->u.b;
        return true;
    }
    if (v->kind == JV_UNDEFINED)
        return jr_undefined_error(r, v);
    return jr_fail(r, STATUS_INVALID, "'%s' object cannot be interpreted as an integer", jv_type_name(v));
}

static bool need_str(struct jrender *r, const struct jv *v, const char *what)
{
    if (v->kind == JV_STR)
        return true;
    if (v->kind == JV_UNDEFINED)
        return jr_undefined_error(r, v);
    return jr_fail(r, STATUS_INVALID, "%s must be str, not %s", what, jv_type_name(v));
}

/* A stable pointer to a template constant, for undefined-error hints. */
static const char *stable_hint(const struct jv *v)
{
    return v && v->kind == JV_STR && v->u.s->refs == JV_IMMORTAL ? v->u.s->data : NULL;
}

static bool new_list(struct jrender *r, struct jv *out, size_t cap, enum jv_seq seq)
{
    return jv_list_new(out, cap, seq) || jr_nomem(r);
}

/* Marks a freshly built list as the iterator reversed() returns. */
static bool as_reversed(bool ok, struct jv *out)
{
    if (ok) {
        out->u.l->seq = JV_SEQ_GEN;
        out->u.l->origin = JV_GEN_REVERSE;
    }
    return ok;
}

static bool make_pair(struct jrender *r, const struct jv *a, const struct jv *b, struct jv *out)
{
    if (!new_list(r, out, 2, JV_SEQ_TUPLE))
        return false;
    if (!jr_list_push(r, out, jv_copy(*a)) || !jr_list_push(r, out, jv_copy(*b))) {
        jv_decref(*out);
        return false;
    }
    return true;
}

/* ---- string helpers -------------------------------------------------------------------------- */

/* Is cp one of the code points of chars[0..n)? */
static bool in_chars(uint32_t cp, const char *chars, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t c;
        i += jtext_decode(chars + i, n - i, &c);
        if (c == cp)
            return true;
    }
    return false;
}

/* str.strip/lstrip/rstrip: [*a, *b) of s. chars NULL = whitespace. */
static void py_strip(const char *s, size_t n, const char *chars, size_t cn, bool left, bool right, size_t *a,
                     size_t *b)
{
    size_t i = 0, j = n;
    if (left) {
        while (i < n) {
            uint32_t cp;
            size_t l = jtext_decode(s + i, n - i, &cp);
            if (chars ? !in_chars(cp, chars, cn) : !jtext_isspace(cp))
                break;
            i += l;
        }
    }
    if (right) {
        while (j > i) {
            size_t st = j - 1;
            while (st > i && j - st < 4 && ((unsigned char)s[st] & 0xC0) == 0x80)
                st--;
            uint32_t cp;
            size_t l = jtext_decode(s + st, j - st, &cp);
            if (st + l != j) {
                st = j - 1;
                cp = (unsigned char)s[st];
            }
            if (chars ? !in_chars(cp, chars, cn) : !jtext_isspace(cp))
                break;
            j = st;
        }
    }
    *a = i;
    *b = j;
}

static bool str_result(struct jrender *r, const char *s, size_t n, bool markup, struct jv *out)
{
    if (!jr_str_new(r, s, n, out))
        return false;
    if (markup)
        out->u.s->markup = 1;
    return true;
}

enum casing { CASE_UPPER, CASE_LOWER, CASE_SWAP, CASE_CAPITALIZE, CASE_PYTITLE, CASE_JTITLE };

/* The multi-character results of Python's full case mapping for the
 * characters chat text is likely to hold (SpecialCasing.txt: ß, the Latin
 * ligatures, ŉ, İ). NULL when the simple one-to-one mapping applies. */
static const char *case_special(uint32_t cp, enum casing how, bool first, bool prev_cased, bool word_start)
{
    /* jinja2's title filter uppercases word starts (item[0].upper()) */
    bool upper = how == CASE_UPPER || how == CASE_SWAP || (how == CASE_JTITLE && word_start);
    bool title = (how == CASE_CAPITALIZE && first) || (how == CASE_PYTITLE && !prev_cased);
    bool lower = how == CASE_LOWER || (how == CASE_CAPITALIZE && !first) ||
                 (how == CASE_PYTITLE && prev_cased) || (how == CASE_JTITLE && !word_start);
    static const struct {
        uint32_t cp;
        const char *up, *ti;
    } tab[] = {
        {0xDF, "SS", "Ss"},   {0xFB00, "FF", "Ff"},   {0xFB01, "FI", "Fi"},
        {0xFB02, "FL", "Fl"}, {0xFB03, "FFI", "Ffi"}, {0xFB04, "FFL", "Ffl"},
        {0xFB05, "ST", "St"}, {0xFB06, "ST", "St"},   {0x149, "\u02BCN", "\u02BCN"},
    };
    if (cp == 0x130 && lower)
        return "i\u0307";
    if (!upper && !title)
        return NULL;
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (tab[i].cp == cp)
            return title && !upper ? tab[i].ti : tab[i].up;
    return NULL;
}

static bool str_case(struct jrender *r, const struct jv *s, enum casing how, struct jv *out)
{
    const char *p = s->u.s->data;
    size_t n = s->u.s->len;
    struct jbuf b = jr_buf();
    bool ok = true, prev_cased = false, first = true, word_start = true, prev_letter = false;
    for (size_t i = 0; ok && i < n;) {
        uint32_t cp, m;
        size_t l = jtext_decode(p + i, n - i, &cp);
        if (l == 1 && cp >= 0x80) { /* invalid byte: copy */
            ok = jbuf_put(&b, p + i, 1);
            i++;
            first = false;
            continue;
        }
        const char *full = case_special(cp, how, first, prev_cased, word_start);
        if (full) { /* Python's full case mappings that are not one code point */
            ok = jbuf_puts(&b, full);
            prev_cased = prev_letter = true; /* all of them are cased letters */
            word_start = first = false;
            i += l;
            continue;
        }
        if (cp == 0x3A3 && (how == CASE_LOWER || how == CASE_SWAP || (!first && how == CASE_CAPITALIZE) ||
                            (prev_cased && how == CASE_PYTITLE) || (!word_start && how == CASE_JTITLE))) {
            /* Python lowers a capital sigma to the final form at the end of a word */
            bool before = prev_letter, after = false;
            size_t j = i + l;
            if (j < n) {
                uint32_t nx;
                jtext_decode(p + j, n - j, &nx);
                after = jtext_is_cased(r->loc, nx);
            }
            ok = jbuf_put_cp(&b, before && !after ? 0x3C2 : 0x3C3);
            prev_cased = prev_letter = true;
            word_start = first = false;
            i += l;
            continue;
        }
        prev_letter = jtext_is_cased(r->loc, cp);
        switch (how) {
        case CASE_UPPER: m = jtext_upper(r->loc, cp); break;
        case CASE_LOWER: m = jtext_lower(r->loc, cp); break;
        case CASE_SWAP:
            m = jtext_is_upper(r->loc, cp)   ? jtext_lower(r->loc, cp)
                : jtext_is_lower(r->loc, cp) ? jtext_upper(r->loc, cp)
                                             : cp;
            break;
        case CASE_CAPITALIZE: m = first ? jtext_upper(r->loc, cp) : jtext_lower(r->loc, cp); break;
        case CASE_PYTITLE:
            m = prev_cased ? jtext_lower(r->loc, cp) : jtext_upper(r->loc, cp);
            prev_cased = jtext_is_cased(r->loc, cp);
            break;
        default: /* jinja2's title: words start after whitespace - ( { [ < */
        {
            bool sep = jtext_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            m = sep ? cp : word_start ? jtext_upper(r->loc, cp) : jtext_lower(r->loc, cp);
            word_start = sep;
            break;
        }
        }
        ok = jbuf_put_cp(&b, m);
        first = false;
        i += l;
    }
    ok = ok ? str_result(r, b.p ? b.p : "", b.len, s->u.s->markup, out) : jr_buf_fail(r, &b);
    jbuf_free(&b);
    return ok;
}

/* str.split / str.rsplit. sep NULL = runs of whitespace. */
static bool str_split(struct jrender *r, const char *s, size_t n, const char *sep, size_t sn,
                      int64_t maxsplit, bool from_right, struct jv *out)
{
    if (sep && sn == 0)
        return jr_fail(r, STATUS_INVALID, "empty separator");
    if (!new_list(r, out, 4, JV_SEQ_LIST))
        return false;
    /* Collect [start,end) pieces, in order. */
    size_t cap = 16, count = 0;
    size_t *pieces = malloc(cap * 2 * sizeof *pieces);
    bool ok = pieces != NULL;
    if (!ok)
        jr_nomem(r);
#define PUSH_PIECE(a_, b_)                                                                                   \
    do {                                                                                                     \
        if (count == cap) {                                                                                  \
            size_t *np_ = realloc(pieces, cap * 4 * sizeof *pieces);                                         \
            if (!np_) {                                                                                      \
                ok = jr_nomem(r);                                                                            \
                break;                                                                                       \
            }                                                                                                \
            pieces = np_;                                                                                    \
            cap *= 2;                                                                                        \
        }                                                                                                    \
        pieces[2 * count] = (a_);                                                                            \
        pieces[2 * count + 1] = (b_);                                                                        \
        count++;                                                                                             \
    } while (0)
    int64_t splits = 0;
    if (ok && !sep && !from_right) {
        size_t i = 0;
        while (ok) {
            size_t a, b2;
            py_strip(s + i, n - i, NULL, 0, true, false, &a, &b2);
            i += a;
            if (i >= n)
                break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                PUSH_PIECE(i, n);
                break;
            }
            size_t j = i;
            while (j < n) {
                uint32_t cp;
                size_t l = jtext_decode(s + j, n - j, &cp);
                if (jtext_isspace(cp))
                    break;
                j += l;
            }
            PUSH_PIECE(i, j);
            splits++;
            i = j;
        }
    } else if (ok && !sep) {
        size_t j = n;
        while (ok) {
            size_t a, b2;
            py_strip(s, j, NULL, 0, false, true, &a, &b2);
            j = b2;
            if (j == 0)
                break;
            if (maxsplit >= 0 && splits >= maxsplit) {
                PUSH_PIECE(0, j);
                break;
            }
            size_t i = j;
            while (i > 0) {
                size_t st = i - 1;
                while (st > 0 && i - st < 4 && ((unsigned char)s[st] & 0xC0) == 0x80)
                    st--;
                uint32_t cp;
                size_t l = jtext_decode(s + st, i - st, &cp);
                if (st + l != i) {
                    st = i - 1;
                    cp = (unsigned char)s[st];
                }
                if (jtext_isspace(cp))
                    break;
                i = st;
            }
            PUSH_PIECE(i, j);
            splits++;
            j = i;
        }
    } else if (ok && !from_right) {
        size_t i = 0;
        for (;;) {
            const char *hit =
                (maxsplit < 0 || splits < maxsplit) && n - i >= sn ? memmem(s + i, n - i, sep, sn) : NULL;
            if (!hit) {
                PUSH_PIECE(i, n);
                break;
            }
            size_t h = (size_t)(hit - s);
            PUSH_PIECE(i, h);
            if (!ok)
                break;
            splits++;
            i = h + sn;
        }
    } else if (ok) {
        size_t j = n;
        for (;;) {
            size_t h = SIZE_MAX;
            if ((maxsplit < 0 || splits < maxsplit) && j >= sn) {
                for (size_t k = j - sn + 1; k-- > 0;) {
                    if (!memcmp(s + k, sep, sn)) {
                        h = k;
                        break;
                    }
                }
            }
            if (h == SIZE_MAX) {
                PUSH_PIECE(0, j);
                break;
            }
            PUSH_PIECE(h + sn, j);
            if (!ok)
                break;
            splits++;
            j = h;
        }
    }
#undef PUSH_PIECE
    if (ok)
        ok = jr_step(r, 1 + n / 64 + count);
    for (size_t k = 0; ok && k < count; k++) {
        size_t idx = from_right ? count - 1 - k : k;
        struct jv piece;
        ok = jr_str_new(r, s + pieces[2 * idx], pieces[2 * idx + 1] - pieces[2 * idx], &piece) &&
             jr_list_push(r, out, piece);
    }
    free(pieces);
    if (!ok)
        jv_decref(*out);
    return ok;
}

static bool str_replace(struct jrender *r, const char *s, size_t n, const char *old, size_t on,
                        const char *rep, size_t rn, int64_t count, struct jv *out)
{
    struct jbuf b = jr_buf();
    bool ok = true;
    int64_t done = 0;
    if (on == 0) { /* Python inserts `rep` around every code point */
        for (size_t i = 0; ok && i <= n;) {
            if (count < 0 || done < count) {
                ok = jbuf_put(&b, rep, rn);
                done++;
            }
            if (i == n)
                break;
            uint32_t cp;
            size_t l = jtext_decode(s + i, n - i, &cp);
            ok = ok && jbuf_put(&b, s + i, l);
            i += l;
        }
    } else {
        size_t i = 0;
        while (ok) {
            const char *hit =
                (count < 0 || done < count) && n - i >= on ? memmem(s + i, n - i, old, on) : NULL;
            if (!hit) {
                ok = jbuf_put(&b, s + i, n - i);
                break;
            }
            size_t h = (size_t)(hit - s);
            ok = jbuf_put(&b, s + i, h - i) && jbuf_put(&b, rep, rn);
            done++;
            i = h + on;
        }
    }
    ok = ok ? jr_str_from_buf(r, &b, out) : jr_buf_fail(r, &b);
    jbuf_free(&b);
    return ok;
}

/* Python's slice-style start/end arguments of find/count/startswith, in code
 * points, converted to a byte range of s. */
static bool str_range(struct jrender *r, const char *s, size_t n, const struct jv *start,
                      const struct jv *end, size_t *a, size_t *b, size_t *cp_a)
{
    *a = 0;
    *b = n;
    *cp_a = 0;
    if (is_none(start) && is_none(end))
        return true;
    size_t ncp = jtext_count_cp(s, n);
    int64_t st = 0, en = (int64_t)ncp;
    if (!is_none(start) && !get_int(r, start, &st))
        return false;
    if (!is_none(end) && !get_int(r, end, &en))
        return false;
    if (st < 0)
        st = st + (int64_t)ncp < 0 ? 0 : st + (int64_t)ncp;
    if (en < 0)
        en = en + (int64_t)ncp < 0 ? 0 : en + (int64_t)ncp;
    if (st > (int64_t)ncp)
        st = (int64_t)ncp;
    if (en > (int64_t)ncp)
        en = (int64_t)ncp;
    if (en < st) {
        *a = *b = n + 1; /* empty and "out of range" (find returns -1 even for "") */
        return true;
    }
    *a = jtext_cp_offset(s, n, (size_t)st);
    *b = jtext_cp_offset(s, n, (size_t)en);
    *cp_a = (size_t)st;
    return true;
}

static bool str_pad(struct jrender *r, const struct jv *s, int64_t width, const char *fill, size_t fill_n,
                    int where /* -1 ljust, 0 center, 1 rjust */, struct jv *out)
{
    size_t len = jtext_count_cp(s->u.s->data, s->u.s->len);
    if (width <= (int64_t)len) {
        *out = jv_copy(*s);
        return true;
    }
    if (width > (int64_t)JINJA_MAX_OUTPUT)
        return jr_fail(r, STATUS_INVALID, "string longer than %zu bytes", JINJA_MAX_OUTPUT);
    size_t marg = (size_t)width - len, left;
    if (where < 0)
        left = 0;
    else if (where > 0)
        left = marg;
    else
        left = marg / 2 + (marg & (size_t)width & 1);
    struct jbuf b = jr_buf();
    bool ok = true;
    for (size_t i = 0; ok && i < left; i++)
        ok = jbuf_put(&b, fill, fill_n);
    ok = ok && jbuf_put(&b, s->u.s->data, s->u.s->len);
    for (size_t i = left; ok && i < marg; i++)
        ok = jbuf_put(&b, fill, fill_n);
    ok = ok ? jr_str_from_buf(r, &b, out) : jr_buf_fail(r, &b);
    jbuf_free(&b);
    return ok;
}

/* ---- Python number parsing (int() / float() of a str) ---------------------------------------- */

static bool parse_py_int(const char *s, size_t n, int base, int64_t *out)
{
    size_t a, b;
    py_strip(s, n, NULL, 0, true, true, &a, &b);
    size_t i = a;
    bool neg = false;
    if (i < b && (s[i] == '+' || s[i] == '-'))
        neg = s[i++] == '-';
    if (i + 1 < b && s[i] == '0') {
        char p = s[i + 1] | 0x20;
        int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == 0 || base == pb)) {
            base = pb;
            i += 2;
            if (i < b && s[i] == '_')
                i++;
        }
    }
    if (base == 0) {
        base = 10;
        /* base 0 refuses leading zeros ("010") unless all zeros */
        if (i + 1 < b && s[i] == '0') {
            for (size_t k = i; k < b; k++)
                if (s[k] != '0' && s[k] != '_')
                    return false;
        }
    }
    if (i >= b)
        return false;
    uint64_t v = 0;
    bool prev_digit = false;
    for (; i < b; i++) {
        char c = s[i];
        if (c == '_') {
            if (!prev_digit || i + 1 >= b || s[i + 1] == '_')
                return false;
            prev_digit = false;
            continue;
        }
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'a' && c <= 'z') ? c - 'a' + 10
                : (c >= 'A' && c <= 'Z') ? c - 'A' + 10
                                         : 99;
        if (d >= base)
            return false;
        if (v > ((uint64_t)INT64_MAX + 1 - (uint64_t)d) / (uint64_t)base)
            return false; /* too large for us: treated as not an int */
        v = v * (uint64_t)base + (uint64_t)d;
        prev_digit = true;
    }
    if (!neg && v > (uint64_t)INT64_MAX)
        return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool parse_py_float(const char *s, size_t n, double *out)
{
    size_t a, b;
    py_strip(s, n, NULL, 0, true, true, &a, &b);
    if (a >= b || b - a > 400)
        return false;
    char buf[512];
    size_t k = 0, i = a;
    if (s[i] == '+' || s[i] == '-')
        buf[k++] = s[i++];
    size_t rest = b - i;
    const char *w = s + i;
    if ((rest == 3 && !strncasecmp(w, "inf", 3)) || (rest == 8 && !strncasecmp(w, "infinity", 8))) {
        *out = buf[0] == '-' ? -INFINITY : INFINITY;
        return true;
    }
    if (rest == 3 && !strncasecmp(w, "nan", 3)) {
        *out = NAN;
        return true;
    }
    bool digits = false, dot = false, exp = false, prev_digit = false;
    for (; i < b; i++) {
        char c = s[i];
        if (c >= '0' && c <= '9') {
            digits = true;
            prev_digit = true;
            buf[k++] = c;
        } else if (c == '_') {
            if (!prev_digit || i + 1 >= b || s[i + 1] < '0' || s[i + 1] > '9')
                return false;
            prev_digit = false;
        } else if (c == '.' && !dot && !exp) {
            dot = true;
            prev_digit = false;
            buf[k++] = c;
        } else if ((c == 'e' || c == 'E') && digits && !exp) {
            exp = true;
            prev_digit = false;
            buf[k++] = c;
            if (i + 1 < b && (s[i + 1] == '+' || s[i + 1] == '-'))
                buf[k++] = s[++i];
            if (i + 1 >= b)
                return false;
        } else {
            return false;
        }
    }
    if (!digits)
        return false;
    buf[k] = '\0';
    *out = strtod(buf, NULL);
    return true;
}

/* ---- attribute getters (jinja2 make_attrgetter) ---------------------------------------------- */

struct getter {
    struct jv parts[MAXP]; /* owned: str or int keys, one per dotted component */
    size_t n;
    const struct jv *dflt; /* borrowed, or NULL */
};

static void getter_free(struct getter *g)
{
    for (size_t i = 0; i < g->n; i++)
        jv_decref(g->parts[i]);
    g->n = 0;
}

static bool getter_init(struct jrender *r, const struct jv *attr, const char *s, size_t n, struct getter *g)
{
    g->n = 0;
    g->dflt = NULL;
    if (!s) {
        if (attr->kind == JV_INT || attr->kind == JV_BOOL) {
            g->parts[g->n++] = jv_copy(*attr);
            return true;
        }
        if (attr->kind != JV_STR)
            return jr_fail(r, STATUS_INVALID, "attribute must be a string or an integer, not %s",
                           jv_type_name(attr));
        s = attr->u.s->data;
        n = attr->u.s->len;
    }
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < n && s[j] != '.')
            j++;
        if (g->n == MAXP) {
            getter_free(g);
            return jr_fail(r, STATUS_INVALID, "attribute path too long");
        }
        bool digits = j > i;
        for (size_t k = i; k < j; k++)
            if (s[k] < '0' || s[k] > '9')
                digits = false;
        int64_t v = 0;
        if (digits && parse_py_int(s + i, j - i, 10, &v)) {
            g->parts[g->n++] = jv_int(v);
        } else if (!jr_str_new(r, s + i, j - i, &g->parts[g->n])) {
            getter_free(g);
            return false;
        } else {
            g->n++;
        }
        if (j >= n)
            break;
        i = j + 1;
    }
    return true;
}

static bool getter_apply(struct jrender *r, const struct getter *g, const struct jv *item, struct jv *out)
{
    struct jv cur = jv_copy(*item);
    for (size_t i = 0; i < g->n; i++) {
        struct jv next;
        bool ok = jr_getitem(r, &cur, &g->parts[i], NULL, &next);
        jv_decref(cur);
        if (!ok)
            return false;
        cur = next;
        if (g->dflt && !is_none(g->dflt) && cur.kind == JV_UNDEFINED)
            cur = jv_copy(*g->dflt);
    }
    *out = cur;
    return true;
}

/* ---- sorting --------------------------------------------------------------------------------- */

struct sort_item {
    struct jv key; /* owned */
    size_t index;
};

struct sort_ctx {
    struct jrender *r;
    bool fold, reverse, failed;
};

/* a before b? (stable merge sort keeps equal items in order, reverse too) */
static bool sort_before(struct sort_ctx *c, const struct sort_item *a, const struct sort_item *b)
{
    if (c->failed)
        return false;
    int cmp;
    if (!jr_compare(c->r, &a->key, &b->key, c->fold, &cmp)) {
        c->failed = true;
        return false;
    }
    return c->reverse ? cmp > 0 : cmp < 0;
}

static void sort_merge(struct sort_ctx *c, struct sort_item *v, struct sort_item *tmp, size_t n)
{
    if (n < 2 || c->failed)
        return;
    size_t h = n / 2;
    sort_merge(c, v, tmp, h);
    sort_merge(c, v + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        if (sort_before(c, &v[j], &v[i]))
            tmp[k++] = v[j++];
        else
            tmp[k++] = v[i++];
    }
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static bool sort_items(struct jrender *r, struct sort_item *v, size_t n, bool fold, bool reverse)
{
    if (!jr_step(r, 1 + n * 4))
        return false;
    struct sort_item *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!tmp)
        return jr_nomem(r);
    struct sort_ctx c = {.r = r, .fold = fold, .reverse = reverse};
    sort_merge(&c, v, tmp, n);
    free(tmp);
    return !c.failed;
}

static void sort_items_free(struct sort_item *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        jv_decref(v[i].key);
    free(v);
}

/* Lowercases strings (jinja2's ignore_case) for set membership. */
static bool fold_key(struct jrender *r, const struct jv *v, bool fold, struct jv *out)
{
    if (fold && v->kind == JV_STR)
        return str_case(r, v, CASE_LOWER, out);
    *out = jv_copy(*v);
    return true;
}

/* ---- filters --------------------------------------------------------------------------------- */

static bool soft_str(struct jrender *r, const struct jv *v, struct jv *out)
{
    return jr_to_str(r, v, out);
}

static bool f_tojson(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    struct jinja_json_opts o = {
        .ensure_ascii = p[0] && jv_truthy(p[0]),
        .sort_keys = p[3] && jv_truthy(p[3]),
        .item_sep = ", ",
        .item_sep_len = 2,
        .key_sep = ": ",
        .key_sep_len = 2,
    };
    char spaces[64];
    struct jv indent_str = jv_none();
    if (!is_none(p[1])) {
        if (p[1]->kind == JV_STR) {
            o.indent = p[1]->u.s->data;
            o.indent_len = p[1]->u.s->len;
        } else {
            int64_t w;
            if (!get_int(r, p[1], &w))
                return false;
            if (w > (int64_t)sizeof spaces) {
                struct jbuf b = jr_buf();
                bool ok = true;
                for (int64_t k = 0; ok && k < w && k < 4096; k++)
                    ok = jbuf_putc(&b, ' ');
                if (!ok || !jr_str_from_buf(r, &b, &indent_str)) {
                    jbuf_free(&b);
                    return r->st ? false : jr_nomem(r);
                }
                jbuf_free(&b);
                o.indent = indent_str.u.s->data;
                o.indent_len = indent_str.u.s->len;
            } else {
                memset(spaces, ' ', sizeof spaces);
                o.indent = spaces;
                o.indent_len = w > 0 ? (size_t)w : 0;
            }
        }
        o.item_sep = ",";
        o.item_sep_len = 1;
    }
    if (!is_none(p[2])) {
        const struct jv *s = p[2];
        if (s->kind != JV_LIST || s->u.l->len != 2 || s->u.l->items[0].kind != JV_STR ||
            s->u.l->items[1].kind != JV_STR) {
            jv_decref(indent_str);
            return jr_fail(r, STATUS_INVALID, "tojson: separators must be a pair of strings");
        }
        o.item_sep = s->u.l->items[0].u.s->data;
        o.item_sep_len = s->u.l->items[0].u.s->len;
        o.key_sep = s->u.l->items[1].u.s->data;
        o.key_sep_len = s->u.l->items[1].u.s->len;
    }
    struct jbuf b = jr_buf();
    bool ok = jinja_tojson(r, in, &o, &b) && jr_str_from_buf(r, &b, out);
    jbuf_free(&b);
    jv_decref(indent_str);
    return ok;
}

static bool f_join(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("join", "d", "attribute");
    struct jv items, sep = jv_none();
    if (!jr_iterate(r, in, &items))
        return false;
    bool ok = true;
    struct getter g = {0};
    bool use_getter = !is_none(p[1]);
    if (use_getter)
        ok = getter_init(r, p[1], NULL, 0, &g);
    if (ok)
        ok = p[0] ? jr_to_str(r, p[0], &sep) : jr_str_new(r, "", 0, &sep);
    struct jbuf b = jr_buf();
    for (size_t i = 0; ok && i < items.u.l->len; i++) {
        struct jv v;
        if (use_getter)
            ok = getter_apply(r, &g, &items.u.l->items[i], &v);
        else
            v = jv_copy(items.u.l->items[i]);
        if (!ok)
            break;
        if ((i && !jbuf_put(&b, sep.u.s->data, sep.u.s->len)) || !jv_to_str(&b, &v))
            ok = jr_buf_fail(r, &b);
        jv_decref(v);
    }
    if (ok)
        ok = jr_str_from_buf(r, &b, out);
    jbuf_free(&b);
    getter_free(&g);
    jv_decref(sep);
    jv_decref(items);
    return ok;
}

static bool f_length(struct jrender *r, const struct jv *in, struct jv *out)
{
    switch (in->kind) {
    case JV_UNDEFINED: *out = jv_int(0); return true;
    case JV_STR: *out = jv_int((int64_t)jtext_count_cp(in->u.s->data, in->u.s->len)); return true;
    case JV_LIST:
        if (in->u.l->seq == JV_SEQ_GEN)
            break;
        *out = jv_int((int64_t)in->u.l->len);
        return true;
    case JV_DICT: *out = jv_int((int64_t)in->u.d->len); return true;
    case JV_LOOP: *out = jv_int((int64_t)in->u.loop->items->len); return true;
    default: break;
    }
    return jr_fail(r, STATUS_INVALID, "object of type '%s' has no len()", jv_type_name(in));
}

static bool f_first_last(struct jrender *r, const struct jv *in, bool last, struct jv *out)
{
    if (jv_is_seq(in, JV_SEQ_GEN)) {
        struct jv_list *g = in->u.l;
        if (last)
            return jr_fail(r, STATUS_INVALID, "'generator' object is not reversible");
        if (!jinja_gen_force(r, g))
            return false;
        if (g->pos < g->len) /* next(): takes one item */
            *out = jv_copy(g->items[g->pos++]);
        else
            *out = jv_undef(JV_UNDEF_OTHER, "No first item, sequence was empty.", 0);
        return true;
    }
    struct jv items;
    if (!jr_iterate(r, in, &items))
        return false;
    size_t n = items.u.l->len;
    if (n == 0)
        *out = jv_undef(JV_UNDEF_OTHER,
                        last ? "No last item, sequence was empty." : "No first item, sequence was empty.", 0);
    else
        *out = jv_copy(items.u.l->items[last ? n - 1 : 0]);
    jv_decref(items);
    return true;
}

static bool f_default(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("default", "default_value", "boolean");
    bool boolean = p[1] && jv_truthy(p[1]);
    if (in->kind == JV_UNDEFINED || (boolean && !jv_truthy(in))) {
        if (p[0]) {
            *out = jv_copy(*p[0]);
            return true;
        }
        return jr_str_new(r, "", 0, out);
    }
    *out = jv_copy(*in);
    return true;
}

static bool f_trim(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("trim", "chars");
    struct jv s;
    if (!is_none(p[0]) && !need_str(r, p[0], "trim() chars"))
        return false;
    if (!soft_str(r, in, &s))
        return false;
    size_t a, b;
    bool chars = !is_none(p[0]);
    py_strip(s.u.s->data, s.u.s->len, chars ? p[0]->u.s->data : NULL, chars ? p[0]->u.s->len : 0, true, true,
             &a, &b);
    bool ok = str_result(r, s.u.s->data + a, b - a, s.u.s->markup, out);
    jv_decref(s);
    return ok;
}

static bool f_replace(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("replace", "old", "new", "count");
    if (!p[0] || !p[1])
        return jr_fail(r, STATUS_INVALID, "replace() missing required argument");
    int64_t count = -1;
    if (!is_none(p[2]) && !get_int(r, p[2], &count))
        return false;
    struct jv s, o, nw;
    if (!soft_str(r, in, &s))
        return false;
    if (!soft_str(r, p[0], &o)) {
        jv_decref(s);
        return false;
    }
    if (!soft_str(r, p[1], &nw)) {
        jv_decref(s);
        jv_decref(o);
        return false;
    }
    bool ok = str_replace(r, s.u.s->data, s.u.s->len, o.u.s->data, o.u.s->len, nw.u.s->data, nw.u.s->len,
                          count, out);
    jv_decref(s);
    jv_decref(o);
    jv_decref(nw);
    return ok;
}

static bool f_int(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("int", "default", "base");
    int64_t base = 10;
    if (p[1] && !get_int(r, p[1], &base))
        return false;
    switch (in->kind) {
    case JV_INT: *out = *in; return true;
    case JV_BOOL: *out = jv_int(in->u.b); return true;
    case JV_FLOAT:
        if (isnan(in->u.f))
            break;
        if (isinf(in->u.f) || fabs(in->u.f) >= 9.2e18)
            return jr_fail(r, STATUS_INVALID, "cannot convert float infinity to integer");
        *out = jv_int((int64_t)in->u.f);
        return true;
    case JV_STR: {
        int64_t v;
        if (base >= 0 && base <= 36 && base != 1 &&
            parse_py_int(in->u.s->data, in->u.s->len, (int)base, &v)) {
            *out = jv_int(v);
            return true;
        }
        double d;
        if (parse_py_float(in->u.s->data, in->u.s->len, &d) && !isnan(d)) {
            if (isinf(d) || fabs(d) >= 9.2e18)
                return jr_fail(r, STATUS_INVALID, "cannot convert float infinity to integer");
            *out = jv_int((int64_t)d);
            return true;
        }
        break;
    }
    case JV_UNDEFINED: return jr_undefined_error(r, in);
    default: break;
    }
    *out = p[0] ? jv_copy(*p[0]) : jv_int(0);
    return true;
}

static bool f_float(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("float", "default");
    double d;
    switch (in->kind) {
    case JV_INT:
    case JV_BOOL:
    case JV_FLOAT: *out = jv_float(jv_as_double(in)); return true;
    case JV_STR:
        if (parse_py_float(in->u.s->data, in->u.s->len, &d)) {
            *out = jv_float(d);
            return true;
        }
        break;
    case JV_UNDEFINED: return jr_undefined_error(r, in);
    default: break;
    }
    *out = p[0] ? jv_copy(*p[0]) : jv_float(0.0);
    return true;
}

/* Python's round(x, ndigits) for floats: correctly rounded, half to even. */
static double round_float(double x, int64_t nd)
{
    if (!isfinite(x) || nd > 320)
        return x;
    if (nd < -320)
        return copysign(0.0, x);
    if (nd >= 0) {
        char buf[512];
        snprintf(buf, sizeof buf, "%.*f", (int)nd, x);
        return strtod(buf, NULL);
    }
    double p = pow(10.0, (double)-nd);
    double y = x / p;
    double z = nearbyint(y);
    return copysign(z * p, x);
}

static bool f_round(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("round", "precision", "method");
    int64_t prec = 0;
    if (p[0] && !get_int(r, p[0], &prec))
        return false;
    const char *method = "common";
    if (p[1]) {
        if (p[1]->kind != JV_STR)
            return jr_fail(r, STATUS_INVALID, "method must be common, ceil or floor");
        method = p[1]->u.s->data;
    }
    bool common = !strcmp(method, "common");
    if (!common && strcmp(method, "ceil") && strcmp(method, "floor"))
        return jr_fail(r, STATUS_INVALID, "method must be common, ceil or floor");
    if (in->kind == JV_UNDEFINED)
        return jr_undefined_error(r, in);
    if (!jv_is_number(in))
        return jr_fail(r, STATUS_INVALID, "type %s doesn't define __round__ method", jv_type_name(in));
    if (!common) {
        double scale = pow(10.0, (double)prec);
        double v = jv_as_double(in) * scale;
        *out = jv_float((method[0] == 'c' ? ceil(v) : floor(v)) / scale);
        return true;
    }
    if (in->kind == JV_FLOAT) {
        *out = jv_float(round_float(in->u.f, prec));
        return true;
    }
    int64_t v = in->kind == JV_INT ? in->u.i : in->u.b;
    if (prec >= 0) {
        *out = jv_int(v);
        return true;
    }
    if (prec < -18) {
        *out = jv_int(0);
        return true;
    }
    int64_t m = 1;
    for (int64_t k = 0; k < -prec; k++)
        m *= 10;
    int64_t q = v / m, rem = v % m;
    if (rem < 0) {
        rem += m;
        q--;
    }
    if (rem * 2 > m || (rem * 2 == m && (q & 1)))
        q++;
    int64_t res;
    if (__builtin_mul_overflow(q, m, &res))
        return jr_fail(r, STATUS_INVALID, "integer overflow");
    *out = jv_int(res);
    return true;
}

static bool f_items(struct jrender *r, const struct jv *in, struct jv *out)
{
    if (in->kind == JV_UNDEFINED)
        return new_list(r, out, 0, JV_SEQ_LIST);
    if (in->kind != JV_DICT)
        return jr_fail(r, STATUS_INVALID, "Can only get item pairs from a mapping.");
    if (!new_list(r, out, in->u.d->len, JV_SEQ_LIST))
        return false;
    for (size_t i = 0; i < in->u.d->len; i++) {
        struct jv pair;
        if (!make_pair(r, &in->u.d->e[i].key, &in->u.d->e[i].val, &pair) || !jr_list_push(r, out, pair)) {
            jv_decref(*out);
            return false;
        }
    }
    return true;
}

static bool f_dictsort(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("dictsort", "case_sensitive", "by", "reverse");
    bool fold = !(p[0] && jv_truthy(p[0]));
    bool reverse = p[2] && jv_truthy(p[2]);
    size_t pos = 0;
    if (p[1]) {
        if (p[1]->kind == JV_STR && !strcmp(p[1]->u.s->data, "value"))
            pos = 1;
        else if (!(p[1]->kind == JV_STR && !strcmp(p[1]->u.s->data, "key")))
            return jr_fail(r, STATUS_INVALID, "You can only sort by either 'key' or 'value'");
    }
    struct jv items;
    if (in->kind == JV_UNDEFINED) /* value.items() */
        return jr_undefined_error(r, in);
    if (!f_items(r, in, &items))
        return false;
    size_t n = items.u.l->len;
    struct sort_item *v = calloc(n ? n : 1, sizeof *v);
    if (!v) {
        jv_decref(items);
        return jr_nomem(r);
    }
    for (size_t i = 0; i < n; i++) {
        v[i].key = jv_copy(items.u.l->items[i].u.l->items[pos]);
        v[i].index = i;
    }
    bool ok = sort_items(r, v, n, fold, reverse) && new_list(r, out, n, JV_SEQ_LIST);
    for (size_t i = 0; ok && i < n; i++)
        if (!jr_list_push(r, out, jv_copy(items.u.l->items[v[i].index]))) {
            jv_decref(*out);
            ok = false;
        }
    sort_items_free(v, n);
    jv_decref(items);
    return ok;
}

/* attribute "a.b,c" -> one getter per comma-separated part (sort's multi-attrgetter) */
static bool f_sort(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("sort", "reverse", "case_sensitive", "attribute");
    bool reverse = p[0] && jv_truthy(p[0]);
    bool fold = !(p[1] && jv_truthy(p[1]));
    struct jv items;
    if (!jr_iterate(r, in, &items))
        return false;
    size_t n = items.u.l->len;
    struct getter gs[MAXP];
    size_t n_g = 0;
    bool ok = true;
    if (!is_none(p[2])) {
        if (p[2]->kind == JV_STR) {
            const char *s = p[2]->u.s->data;
            size_t len = p[2]->u.s->len, i = 0;
            while (ok) {
                size_t j = i;
                while (j < len && s[j] != ',')
                    j++;
                if (n_g == MAXP) {
                    ok = jr_fail(r, STATUS_INVALID, "too many sort attributes");
                    break;
                }
                ok = getter_init(r, p[2], s + i, j - i, &gs[n_g]);
                if (ok)
                    n_g++;
                if (j >= len)
                    break;
                i = j + 1;
            }
        } else {
            ok = getter_init(r, p[2], NULL, 0, &gs[0]);
            if (ok)
                n_g = 1;
        }
    }
    struct sort_item *v = ok ? calloc(n ? n : 1, sizeof *v) : NULL;
    if (ok && !v)
        ok = jr_nomem(r);
    size_t made = 0;
    for (size_t i = 0; ok && i < n; i++) {
        v[i].index = i;
        if (n_g == 0) {
            v[i].key = jv_copy(items.u.l->items[i]);
        } else if (n_g == 1) {
            ok = getter_apply(r, &gs[0], &items.u.l->items[i], &v[i].key);
        } else {
            ok = new_list(r, &v[i].key, n_g, JV_SEQ_LIST);
            for (size_t k = 0; ok && k < n_g; k++) {
                struct jv part;
                ok = getter_apply(r, &gs[k], &items.u.l->items[i], &part) && jr_list_push(r, &v[i].key, part);
            }
            if (!ok && v[i].key.kind == JV_LIST)
                jv_decref(v[i].key);
        }
        if (ok)
            made++;
    }
    if (ok)
        ok = sort_items(r, v, n, fold, reverse) && new_list(r, out, n, JV_SEQ_LIST);
    for (size_t i = 0; ok && i < n; i++)
        if (!jr_list_push(r, out, jv_copy(items.u.l->items[v[i].index]))) {
            jv_decref(*out);
            ok = false;
        }
    if (v)
        sort_items_free(v, made);
    for (size_t k = 0; k < n_g; k++)
        getter_free(&gs[k]);
    jv_decref(items);
    return ok;
}

static bool f_unique(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("unique", "case_sensitive", "attribute");
    *out = jv_none();
    bool fold = !(p[0] && jv_truthy(p[0]));
    struct jv items, seen;
    if (!jr_iterate(r, in, &items))
        return false;
    struct getter g = {0};
    bool use_getter = !is_none(p[1]);
    bool ok = (!use_getter || getter_init(r, p[1], NULL, 0, &g));
    if (ok && !jv_dict_new(&seen, JV_DICT))
        ok = jr_nomem(r);
    else if (!ok)
        seen = jv_none();
    if (ok && !new_list(r, out, 4, JV_SEQ_LIST))
        ok = false;
    for (size_t i = 0; ok && i < items.u.l->len; i++) {
        struct jv key, k2;
        const struct jv *item = &items.u.l->items[i];
        ok = use_getter ? getter_apply(r, &g, item, &key) : (key = jv_copy(*item), true);
        if (!ok)
            break;
        ok = fold_key(r, &key, fold, &k2);
        jv_decref(key);
        if (!ok)
            break;
        if (!jr_hashable(r, &k2)) {
            jv_decref(k2);
            ok = false;
            break;
        }
        if (jv_dict_get(seen.u.d, &k2)) {
            jv_decref(k2);
            continue;
        }
        ok = jr_dict_set(r, &seen, k2, jv_none()) && jr_list_push(r, out, jv_copy(*item));
    }
    if (!ok)
        jv_decref(*out);
    getter_free(&g);
    jv_decref(seen);
    jv_decref(items);
    return ok;
}

static bool f_minmax(struct jrender *r, const struct jv *in, const struct jargs *args, bool max,
                     struct jv *out)
{
    BIND(max ? "max" : "min", "case_sensitive", "attribute");
    bool fold = !(p[0] && jv_truthy(p[0]));
    struct jv items;
    if (!jr_iterate(r, in, &items))
        return false;
    size_t n = items.u.l->len;
    if (n == 0) {
        jv_decref(items);
        *out = jv_undef(JV_UNDEF_OTHER, "No aggregated item, sequence was empty.", 0);
        return true;
    }
    struct getter g = {0};
    bool use_getter = !is_none(p[1]);
    bool ok = !use_getter || getter_init(r, p[1], NULL, 0, &g);
    size_t best = 0;
    struct jv best_key = jv_none();
    for (size_t i = 0; ok && i < n; i++) {
        struct jv key;
        ok = use_getter ? getter_apply(r, &g, &items.u.l->items[i], &key)
                        : (key = jv_copy(items.u.l->items[i]), true);
        if (!ok)
            break;
        if (i == 0) {
            best_key = key;
            continue;
        }
        int cmp;
        ok = jr_compare(r, &key, &best_key, fold, &cmp);
        if (ok && (max ? cmp > 0 : cmp < 0)) {
            jv_decref(best_key);
            best_key = key;
            best = i;
        } else {
            jv_decref(key);
        }
    }
    if (ok)
        *out = jv_copy(items.u.l->items[best]);
    jv_decref(best_key);
    getter_free(&g);
    jv_decref(items);
    return ok;
}

static bool f_sum(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("sum", "attribute", "start");
    struct jv items;
    if (!jr_iterate(r, in, &items))
        return false;
    struct getter g = {0};
    bool use_getter = !is_none(p[0]);
    bool ok = !use_getter || getter_init(r, p[0], NULL, 0, &g);
    struct jv acc = p[1] ? jv_copy(*p[1]) : jv_int(0);
    if (ok && acc.kind == JV_STR)
        ok = jr_fail(r, STATUS_INVALID, "sum() can't sum strings [use ''.join(seq) instead]");
    for (size_t i = 0; ok && i < items.u.l->len; i++) {
        struct jv x, next;
        ok = use_getter ? getter_apply(r, &g, &items.u.l->items[i], &x)
                        : (x = jv_copy(items.u.l->items[i]), true);
        if (!ok)
            break;
        ok = jr_binop(r, JOP_ADD, &acc, &x, &next);
        jv_decref(x);
        if (ok) {
            jv_decref(acc);
            acc = next;
        }
    }
    getter_free(&g);
    jv_decref(items);
    if (!ok) {
        jv_decref(acc);
        return false;
    }
    *out = acc;
    return true;
}

static bool f_reverse(struct jrender *r, const struct jv *in, struct jv *out)
{
    if (in->kind == JV_STR) {
        const char *s = in->u.s->data;
        size_t n = in->u.s->len;
        struct jbuf b = jr_buf();
        bool ok = jbuf_put(&b, s, n); /* same length: reversed code points */
        if (ok) {
            size_t k = n;
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                size_t l = jtext_decode(s + i, n - i, &cp);
                k -= l;
                memcpy(b.p + k, s + i, l);
                i += l;
            }
        }
        ok = ok ? jr_str_from_buf(r, &b, out) : jr_buf_fail(r, &b);
        jbuf_free(&b);
        return ok;
    }
    /* reversed() of a sequence is an iterator; a generator is listed first */
    bool gen = !jv_is_seq(in, JV_SEQ_GEN);
    struct jv items;
    if (!jr_iterate(r, in, &items))
        return false;
    size_t n = items.u.l->len;
    bool ok = new_list(r, out, n, JV_SEQ_LIST);
    for (size_t i = n; ok && i-- > 0;)
        if (!jr_list_push(r, out, jv_copy(items.u.l->items[i]))) {
            jv_decref(*out);
            ok = false;
        }
    jv_decref(items);
    return gen ? as_reversed(ok, out) : ok;
}

static bool f_indent(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("indent", "width", "first", "blank");
    struct jv ind = jv_none(), s;
    bool ok = true;
    if (p[0] && p[0]->kind == JV_STR) {
        ind = jv_copy(*p[0]);
    } else {
        int64_t w = 4;
        if (p[0] && !get_int(r, p[0], &w))
            return false;
        if (w > 4096)
            w = 4096;
        char sp[4096];
        memset(sp, ' ', sizeof sp);
        ok = jr_str_new(r, sp, w > 0 ? (size_t)w : 0, &ind);
    }
    if (!ok)
        return false;
    bool first = p[1] && jv_truthy(p[1]), blank = p[2] && jv_truthy(p[2]);
    if (in->kind != JV_STR) { /* jinja2 does s += "\n" first */
        jv_decref(ind);
        if (in->kind == JV_UNDEFINED)
            return jr_undefined_error(r, in);
        return jr_fail(r, STATUS_INVALID, "unsupported operand type(s) for +=: '%s' and 'str'",
                       jv_type_name(in));
    }
    s = jv_copy(*in);
    /* s + "\n" split into lines (str.splitlines), rejoined with "\n" + indent */
    const char *t = s.u.s->data;
    size_t n = s.u.s->len;
    struct jbuf b = jr_buf();
    if (first)
        ok = jbuf_put(&b, ind.u.s->data, ind.u.s->len);
    size_t i = 0, line_no = 0;
    /* lines of s + "\n": every line of s, each ended by its break, plus nothing after a final break */
    while (ok && i < n) {
        size_t j = i, brk = n, next = n;
        while (j < n) {
            uint32_t cp;
            size_t l = jtext_decode(t + j, n - j, &cp);
            if (jtext_islinebreak(cp)) {
                brk = j;
                next = j + l;
                if (cp == '\r' && next < n && t[next] == '\n')
                    next++;
                break;
            }
            j += l;
        }
        if (j >= n)
            brk = next = n;
        if (line_no > 0) {
            ok = jbuf_putc(&b, '\n');
            if (ok && (blank || brk > i))
                ok = jbuf_put(&b, ind.u.s->data, ind.u.s->len);
        }
        ok = ok && jbuf_put(&b, t + i, brk - i);
        line_no++;
        i = next;
    }
    ok = ok ? str_result(r, b.p ? b.p : "", b.len, s.u.s->markup, out) : jr_buf_fail(r, &b);
    jbuf_free(&b);
    jv_decref(s);
    jv_decref(ind);
    return ok;
}

static bool f_wordcount(struct jrender *r, const struct jv *in, struct jv *out)
{
    struct jv s;
    if (!soft_str(r, in, &s))
        return false;
    int64_t count = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.u.s->len;) {
        uint32_t cp;
        i += jtext_decode(s.u.s->data + i, s.u.s->len - i, &cp);
        bool w = cp == '_' || jtext_isalnum(cp);
        if (w && !in_word)
            count++;
        in_word = w;
    }
    jv_decref(s);
    *out = jv_int(count);
    return true;
}

static bool f_truncate(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("truncate", "length", "killwords", "end", "leeway");
    int64_t length = 255, leeway = 5;
    if (p[0] && !get_int(r, p[0], &length))
        return false;
    if (!is_none(p[3]) && !get_int(r, p[3], &leeway))
        return false;
    bool killwords = p[1] && jv_truthy(p[1]);
    const char *end = "...";
    size_t end_n = 3;
    if (p[2]) {
        if (!need_str(r, p[2], "truncate() end"))
            return false;
        end = p[2]->u.s->data;
        end_n = p[2]->u.s->len;
    }
    int64_t end_cp = (int64_t)jtext_count_cp(end, end_n);
    if (length < end_cp)
        return jr_fail(r, STATUS_INVALID, "expected length >= %" PRId64 ", got %" PRId64, end_cp, length);
    if (leeway < 0)
        return jr_fail(r, STATUS_INVALID, "expected leeway >= 0, got %" PRId64, leeway);
    struct jv s;
    if (in->kind == JV_UNDEFINED) { /* len(Undefined) is 0: returned as is */
        *out = *in;
        return true;
    }
    if (in->kind != JV_STR) { /* len(s) <= length + leeway returns s as it is */
        struct jv n;
        if (!f_length(r, in, &n))
            return false;
        if (n.u.i > length + leeway)
            return jr_fail(r, STATUS_INVALID, "truncate: '%s' is not a string", jv_type_name(in));
        *out = jv_copy(*in);
        return true;
    }
    s = jv_copy(*in);
    int64_t len = (int64_t)jtext_count_cp(s.u.s->data, s.u.s->len);
    if (len <= length + leeway) {
        *out = s;
        return true;
    }
    size_t cut = jtext_cp_offset(s.u.s->data, s.u.s->len, (size_t)(length - end_cp));
    if (!killwords) {
        size_t k = cut;
        while (k > 0 && s.u.s->data[k - 1] != ' ')
            k--;
        if (k > 0)
            cut = k - 1;
    }
    struct jbuf b = jr_buf();
    bool ok = jbuf_put(&b, s.u.s->data, cut) && jbuf_put(&b, end, end_n);
    ok = ok ? jr_str_from_buf(r, &b, out) : jr_buf_fail(r, &b);
    jbuf_free(&b);
    jv_decref(s);
    return ok;
}

static bool f_batch(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    BIND("batch", "linecount", "fill_with");
    int64_t lc = 0;
    *out = jv_none();
    if (!p[0])
        return jr_fail(r, STATUS_INVALID, "batch() missing required argument 'linecount'");
    if (!get_int(r, p[0], &lc))
        return false;
    if (lc <= 0)
        return jr_fail(r, STATUS_INVALID, "batch() linecount must be positive");
    struct jv items;
    if (!jr_iterate(r, in, &items))
        return false;
    size_t n = items.u.l->len;
    bool ok = new_list(r, out, 4, JV_SEQ_LIST);
    for (size_t i = 0; ok && i < n; i += (size_t)lc) {
        struct jv row;
        ok = new_list(r, &row, (size_t)lc < 64 ? (size_t)lc : 64, JV_SEQ_LIST);
        for (size_t k = 0; ok && k < (size_t)lc; k++) {
            if (i + k < n)
                ok = jr_list_push(r, &row, jv_copy(items.u.l->items[i + k]));
            else if (p[1])
                ok = jr_list_push(r, &row, jv_copy(*p[1]));
            else
                break;
        }
        if (ok)
            ok = jr_list_push(r, out, row);
        else if (row.kind == JV_LIST)
            jv_decref(row);
    }
    if (!ok)
        jv_decref(*out);
    jv_decref(items);
    return ok;
}

static bool f_escape(struct jrender *r, const struct jv *in, bool force, struct jv *out)
{
    if (in->kind == JV_STR && in->u.s->markup && !force) {
        *out = jv_copy(*in);
        return true;
    }
    struct jv s;
    if (!jr_to_str(r, in, &s))
        return false;
    struct jbuf b = jr_buf();
    bool ok = jtext_html_escape(&b, s.u.s->data, s.u.s->len);
    ok = ok ? str_result(r, b.p ? b.p : "", b.len, true, out) : jr_buf_fail(r, &b);
    jbuf_free(&b);
    jv_decref(s);
    return ok;
}

static bool f_safe(struct jrender *r, const struct jv *in, struct jv *out)
{
    struct jv s;
    if (!jr_to_str(r, in, &s))
        return false;
    if (s.u.s->markup) {
        *out = s;
        return true;
    }
    bool ok = str_result(r, s.u.s->data, s.u.s->len, true, out);
    jv_decref(s);
    return ok;
}

/* map / select / reject / selectattr / rejectattr */
static bool f_map(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    struct jv items;
    struct getter g = {0};
    if (!jv_truthy(in)) /* jinja2: `if value:` before anything else */
        return new_list(r, out, 0, JV_SEQ_LIST);
    bool by_attr = false;
    int filter_id = -1;
    const struct jv *dflt = NULL;
    if (args->n_pos == 0) {
        const struct jv *attr = NULL;
        for (size_t k = 0; k < args->n_kw; k++) {
            if (!strcmp(args->kw_names[k], "attribute"))
                attr = &args->kw_vals[k];
            else if (!strcmp(args->kw_names[k], "default"))
                dflt = &args->kw_vals[k];
            else
                return jr_fail(r, STATUS_INVALID, "Unexpected keyword argument '%s'", args->kw_names[k]);
        }
        if (!attr)
            return jr_fail(r, STATUS_INVALID, "map requires a filter argument");
        if (!getter_init(r, attr, NULL, 0, &g))
            return false;
        g.dflt = dflt;
        by_attr = true;
    } else {
        if (args->pos[0].kind != JV_STR)
            return jr_fail(r, STATUS_INVALID, "map requires a filter name");
        filter_id = jinja_filter_find(args->pos[0].u.s->data);
        if (filter_id < 0)
            return jr_fail(r, STATUS_INVALID, "No filter named '%s'", args->pos[0].u.s->data);
    }
    if (!jr_iterate(r, in, &items)) {
        getter_free(&g);
        return false;
    }
    struct jargs rest = *args;
    if (!by_attr) {
        rest.pos++;
        rest.n_pos--;
    }
    bool ok = new_list(r, out, items.u.l->len, JV_SEQ_LIST);
    for (size_t i = 0; ok && i < items.u.l->len; i++) {
        struct jv v;
        ok = by_attr ? getter_apply(r, &g, &items.u.l->items[i], &v)
                     : jinja_filter_call(r, filter_id, &items.u.l->items[i], &rest, &v);
        if (ok)
            ok = jr_list_push(r, out, v);
        if (!ok)
            jv_decref(*out);
    }
    getter_free(&g);
    jv_decref(items);
    return ok;
}

static bool f_select(struct jrender *r, const struct jv *in, const struct jargs *args, bool attr, bool reject,
                     struct jv *out)
{
    struct getter g = {0};
    size_t off = 0;
    *out = jv_none();
    if (!jv_truthy(in)) /* jinja2: `if value:` before anything else */
        return new_list(r, out, 0, JV_SEQ_LIST);
    if (attr) {
        if (args->n_pos < 1)
            return jr_fail(r, STATUS_INVALID, "Missing parameter for attribute name");
        if (!getter_init(r, &args->pos[0], NULL, 0, &g))
            return false;
        off = 1;
    }
    int test_id = -1;
    if (args->n_pos > off) {
        if (args->pos[off].kind != JV_STR) {
            getter_free(&g);
            return jr_fail(r, STATUS_INVALID, "a test name must be a string");
        }
        test_id = jinja_test_find(args->pos[off].u.s->data);
        if (test_id < 0) {
            getter_free(&g);
            return jr_fail(r, STATUS_INVALID, "No test named '%s'", args->pos[off].u.s->data);
        }
    }
    struct jargs rest = *args; /* the test's own arguments */
    rest.pos = args->n_pos > off ? args->pos + off + 1 : NULL;
    rest.n_pos = args->n_pos > off ? args->n_pos - off - 1 : 0;
    struct jv items;
    if (!jr_iterate(r, in, &items)) {
        getter_free(&g);
        return false;
    }
    bool ok = new_list(r, out, 4, JV_SEQ_LIST);
    for (size_t i = 0; ok && i < items.u.l->len; i++) {
        const struct jv *item = &items.u.l->items[i];
        struct jv v;
        ok = attr ? getter_apply(r, &g, item, &v) : (v = jv_copy(*item), true);
        if (!ok)
            break;
        bool t;
        if (test_id >= 0)
            ok = jinja_test_call(r, test_id, &v, &rest, &t);
        else
            t = jv_truthy(&v);
        jv_decref(v);
        if (ok && t != reject)
            ok = jr_list_push(r, out, jv_copy(*item));
    }
    if (!ok)
        jv_decref(*out);
    getter_free(&g);
    jv_decref(items);
    return ok;
}

static bool f_format(struct jrender *r, const struct jv *in, const struct jargs *args, struct jv *out)
{
    if (args->n_pos && args->n_kw)
        return jr_fail(r, STATUS_INVALID, "can't handle positional and keyword arguments at the same time");
    struct jv s, a;
    if (!soft_str(r, in, &s))
        return false;
    bool ok;
    if (args->n_kw) {
        ok = jv_dict_new(&a, JV_DICT) || jr_nomem(r);
        for (size_t k = 0; ok && k < args->n_kw; k++) {
            struct jv key;
            ok = jr_str_new(r, args->kw_names[k], strlen(args->kw_names[k]), &key) &&
                 jr_dict_set(r, &a, key, jv_copy(args->kw_vals[k]));
        }
    } else {
        ok = new_list(r, &a, args->n_pos, JV_SEQ_TUPLE);
        for (size_t k = 0; ok && k < args->n_pos; k++)
            ok = jr_list_push(r, &a, jv_copy(args->pos[k]));
    }
    if (ok)
        ok = jinja_percent_format(r, &s, &a, out);
    if (a.kind == JV_LIST || a.kind == JV_DICT)
        jv_decref(a);
    jv_decref(s);
    return ok;
}

static bool filter_eager(struct jrender *r, int id, const struct jv *in, const struct jargs *args,
                         struct jv *out)
{
    struct jv s;
    bool ok;
    switch (id) {
    case F_TOJSON: return f_tojson(r, in, args, out);
    case F_JOIN: return f_join(r, in, args, out);
    case F_LENGTH: return no_args(r, "length", args) && f_length(r, in, out);
    case F_FIRST: return no_args(r, "first", args) && f_first_last(r, in, false, out);
    case F_LAST: return no_args(r, "last", args) && f_first_last(r, in, true, out);
    case F_DEFAULT: return f_default(r, in, args, out);
    case F_TRIM: return f_trim(r, in, args, out);
    case F_REPLACE: return f_replace(r, in, args, out);
    case F_UPPER:
    case F_LOWER:
    case F_CAPITALIZE:
    case F_TITLE:
        if (!no_args(r, "filter", args) || !soft_str(r, in, &s))
            return false;
        ok = str_case(r, &s,
                      id == F_UPPER        ? CASE_UPPER
                      : id == F_LOWER      ? CASE_LOWER
                      : id == F_CAPITALIZE ? CASE_CAPITALIZE
                                           : CASE_JTITLE,
                      out);
        jv_decref(s);
        return ok;
    case F_STRING:
        if (!no_args(r, "string", args))
            return false;
        return soft_str(r, in, out);
    case F_LIST: return no_args(r, "list", args) && jr_iterate(r, in, out);
    case F_INT: return f_int(r, in, args, out);
    case F_FLOAT: return f_float(r, in, args, out);
    case F_ABS:
        if (!no_args(r, "abs", args))
            return false;
        if (in->kind == JV_INT || in->kind == JV_BOOL) {
            int64_t v = in->kind == JV_INT ? in->u.i : in->u.b;
            if (v == INT64_MIN)
                return jr_fail(r, STATUS_INVALID, "integer overflow");
            *out = jv_int(v < 0 ? -v : v);
            return true;
        }
        if (in->kind == JV_FLOAT) {
            *out = jv_float(fabs(in->u.f));
            return true;
        }
        if (in->kind == JV_UNDEFINED)
            return jr_undefined_error(r, in);
        return jr_fail(r, STATUS_INVALID, "bad operand type for abs(): '%s'", jv_type_name(in));
    case F_ROUND: return f_round(r, in, args, out);
    case F_ITEMS: return no_args(r, "items", args) && f_items(r, in, out);
    case F_DICTSORT: return f_dictsort(r, in, args, out);
    case F_SORT: return f_sort(r, in, args, out);
    case F_UNIQUE: return f_unique(r, in, args, out);
    case F_MIN: return f_minmax(r, in, args, false, out);
    case F_MAX: return f_minmax(r, in, args, true, out);
    case F_SUM: return f_sum(r, in, args, out);
    case F_REVERSE: return no_args(r, "reverse", args) && f_reverse(r, in, out);
    case F_MAP: return f_map(r, in, args, out);
    case F_SELECT: return f_select(r, in, args, false, false, out);
    case F_REJECT: return f_select(r, in, args, false, true, out);
    case F_SELECTATTR: return f_select(r, in, args, true, false, out);
    case F_REJECTATTR: return f_select(r, in, args, true, true, out);
    case F_INDENT: return f_indent(r, in, args, out);
    case F_CENTER: {
        BIND("center", "width");
        int64_t w = 80;
        if (p[0] && !get_int(r, p[0], &w))
            return false;
        if (!soft_str(r, in, &s))
            return false;
        ok = str_pad(r, &s, w, " ", 1, 0, out);
        jv_decref(s);
        return ok;
    }
    case F_WORDCOUNT: return no_args(r, "wordcount", args) && f_wordcount(r, in, out);
    case F_TRUNCATE: return f_truncate(r, in, args, out);
    case F_BATCH: return f_batch(r, in, args, out);
    case F_SAFE: return no_args(r, "safe", args) && f_safe(r, in, out);
    case F_ESCAPE: return no_args(r, "escape", args) && f_escape(r, in, false, out);
    case F_FORCEESCAPE: return no_args(r, "forceescape", args) && f_escape(r, in, true, out);
    case F_FORMAT: return f_format(r, in, args, out);
    case F_ATTR: {
        BIND("attr", "name");
        if (!p[0])
            return jr_fail(r, STATUS_INVALID, "attr() missing required argument 'name'");
        if (!soft_str(r, p[0], &s))
            return false;
        ok = jr_pyattr(r, in, s.u.s->data, s.u.s->len, stable_hint(p[0]), out);
        jv_decref(s);
        return ok;
    }
    default: return jr_fail(r, STATUS_INVALID, "unknown filter");
    }
}

static bool filter_is_generator(int id)
{
    return id == F_MAP || id == F_SELECT || id == F_REJECT || id == F_SELECTATTR || id == F_REJECTATTR ||
           id == F_UNIQUE || id == F_BATCH || id == F_ITEMS;
}

/* A generator that will run filter `id` on first use (jinja2 semantics). */
static bool make_lazy(struct jrender *r, int id, const struct jv *in, const struct jargs *args,
                      struct jv *out)
{
    size_t depth = jv_depth(in);
    for (size_t i = 0; i < args->n_pos; i++)
        if (jv_depth(&args->pos[i]) > depth)
            depth = jv_depth(&args->pos[i]);
    for (size_t i = 0; i < args->n_kw; i++)
        if (jv_depth(&args->kw_vals[i]) > depth)
            depth = jv_depth(&args->kw_vals[i]);
    if (depth + 1 > JV_MAX_DEPTH)
        return jr_fail(r, STATUS_INVALID, "values nested deeper than %d levels", JV_MAX_DEPTH);
    struct jv_lazy *z = calloc(1, sizeof *z);
    if (!z)
        return jr_nomem(r);
    z->filter_id = id;
    z->input = jv_copy(*in);
    z->kw_names = args->kw_names;
    if ((args->n_pos && !(z->pos = malloc(args->n_pos * sizeof *z->pos))) ||
        (args->n_kw && !(z->kw_vals = malloc(args->n_kw * sizeof *z->kw_vals))) ||
        !jv_list_new(out, 0, JV_SEQ_GEN)) {
        jv_lazy_free(z);
        return jr_nomem(r);
    }
    for (; z->n_pos < args->n_pos; z->n_pos++)
        z->pos[z->n_pos] = jv_copy(args->pos[z->n_pos]);
    for (; z->n_kw < args->n_kw; z->n_kw++)
        z->kw_vals[z->n_kw] = jv_copy(args->kw_vals[z->n_kw]);
    out->u.l->lazy = z;
    out->u.l->depth = (uint16_t)(depth + 1);
    out->u.l->origin = id == F_MAP      ? JV_GEN_MAP
                       : id == F_UNIQUE ? JV_GEN_UNIQUE
                       : id == F_BATCH  ? JV_GEN_BATCH
                       : id == F_ITEMS  ? JV_GEN_ITEMS
                                        : JV_GEN_SELECT;
    return true;
}

bool jinja_gen_force(struct jrender *r, struct jv_list *gen)
{
    struct jv_lazy *z = gen->lazy;
    if (!z)
        return true;
    gen->lazy = NULL; /* runs once, even if it fails */
    bool ok = true;
    if (r->depth + 4 > JINJA_MAX_EVAL_DEPTH)
        ok = jr_fail(r, STATUS_INVALID, "template recursion too deep");
    struct jv res;
    if (ok) {
        r->depth += 4;
        struct jargs a = {.pos = z->pos,
                          .n_pos = z->n_pos,
                          .kw_names = z->kw_names,
                          .kw_vals = z->kw_vals,
                          .n_kw = z->n_kw};
        ok = filter_eager(r, z->filter_id, &z->input, &a, &res);
        r->depth -= 4;
    }
    if (ok) {
        struct jv self = {.kind = JV_LIST};
        self.u.l = gen;
        for (size_t i = 0; ok && i < res.u.l->len; i++)
            ok = jr_list_push(r, &self, jv_copy(res.u.l->items[i]));
        jv_decref(res);
    }
    jv_lazy_free(z);
    return ok;
}

bool jinja_filter_call(struct jrender *r, int id, const struct jv *in, const struct jargs *args,
                       struct jv *out)
{
    if (filter_is_generator(id))
        return make_lazy(r, id, in, args, out);
    return filter_eager(r, id, in, args, out);
}

/* ---- tests ----------------------------------------------------------------------------------- */

static bool test_int_mod(struct jrender *r, const struct jv *v, const struct jv *d, bool *zero_rem)
{
    struct jv res;
    if (!jr_binop(r, JOP_MOD, v, d, &res))
        return false;
    *zero_rem = !jv_truthy(&res);
    jv_decref(res);
    return true;
}

static bool str_all_cased(struct jrender *r, const struct jv *v, bool upper, bool *out)
{
    struct jv s;
    if (!jr_to_str(r, v, &s))
        return false;
    bool any = false, all = true;
    for (size_t i = 0; i < s.u.s->len;) {
        uint32_t cp;
        i += jtext_decode(s.u.s->data + i, s.u.s->len - i, &cp);
        if (upper ? jtext_is_lower(r->loc, cp) : jtext_is_upper(r->loc, cp))
            all = false;
        if (jtext_is_cased(r->loc, cp))
            any = true;
    }
    jv_decref(s);
    *out = any && all;
    return true;
}

bool jinja_test_call(struct jrender *r, int id, const struct jv *v, const struct jargs *args, bool *out)
{
    const struct jv *arg = args->n_pos ? &args->pos[0] : args->n_kw ? &args->kw_vals[0] : NULL;
    size_t n_args = args->n_pos + args->n_kw;
    bool one = id == T_DIVISIBLEBY || id == T_EQ || id == T_NE || id == T_LT || id == T_LE || id == T_GT ||
               id == T_GE || id == T_IN || id == T_SAMEAS;
    if (one ? n_args != 1 : n_args != 0)
        return jr_fail(r, STATUS_INVALID, "test takes %s", one ? "exactly one argument" : "no arguments");
    int cmp;
    bool zero;
    switch (id) {
    case T_DEFINED: *out = v->kind != JV_UNDEFINED; return true;
    case T_UNDEFINED: *out = v->kind == JV_UNDEFINED; return true;
    case T_NONE: *out = v->kind == JV_NONE; return true;
    case T_BOOLEAN: *out = v->kind == JV_BOOL; return true;
    case T_TRUE: *out = v->kind == JV_BOOL && v->u.b; return true;
    case T_FALSE: *out = v->kind == JV_BOOL && !v->u.b; return true;
    case T_INTEGER: *out = v->kind == JV_INT; return true;
    case T_FLOAT: *out = v->kind == JV_FLOAT; return true;
    case T_NUMBER: *out = jv_is_number(v); return true;
    case T_STRING: *out = v->kind == JV_STR; return true;
    case T_MAPPING: *out = v->kind == JV_DICT; return true;
    case T_ITERABLE:
        *out = v->kind == JV_STR || v->kind == JV_LIST || v->kind == JV_DICT || v->kind == JV_UNDEFINED ||
               v->kind == JV_LOOP;
        return true;
    case T_SEQUENCE: /* len() and __getitem__ */
        *out = v->kind == JV_STR || jv_is_indexable(v) || v->kind == JV_DICT || v->kind == JV_UNDEFINED;
        return true;
    case T_CALLABLE: *out = v->kind == JV_FUNC || v->kind == JV_UNDEFINED || v->kind == JV_LOOP; return true;
    case T_ESCAPED: *out = v->kind == JV_STR && v->u.s->markup; return true;
    case T_EQ: *out = jv_equal(v, arg); return true;
    case T_NE: *out = !jv_equal(v, arg); return true;
    case T_LT:
    case T_LE:
    case T_GT:
    case T_GE:
        if (!jr_compare(r, v, arg, false, &cmp))
            return false;
        *out = id == T_LT ? cmp < 0 : id == T_LE ? cmp <= 0 : id == T_GT ? cmp > 0 : cmp >= 0;
        return true;
    case T_IN: return jr_contains(r, arg, v, out);
    case T_ODD:
    case T_EVEN: {
        struct jv two = jv_int(2), res;
        if (!jr_binop(r, JOP_MOD, v, &two, &res))
            return false;
        struct jv one = jv_int(1);
        *out = id == T_ODD ? jv_equal(&res, &one) : !jv_truthy(&res);
        jv_decref(res);
        return true;
    }
    case T_DIVISIBLEBY:
        if (!test_int_mod(r, v, arg, &zero))
            return false;
        *out = zero;
        return true;
    case T_SAMEAS:
        if (v->kind != arg->kind)
            *out = false;
        else if (v->kind == JV_NONE || v->kind == JV_UNDEFINED)
            *out = v->kind == JV_NONE;
        else if (v->kind == JV_BOOL)
            *out = v->u.b == arg->u.b;
        else if (v->kind == JV_INT)
            *out = v->u.i == arg->u.i && v->u.i >= -5 && v->u.i <= 256;
        else if (v->kind == JV_FLOAT)
            *out = false;
        else
            *out = v->u.s == arg->u.s; /* same heap object (any pointer member) */
        return true;
    case T_LOWER: return str_all_cased(r, v, false, out);
    case T_UPPER: return str_all_cased(r, v, true, out);
    case T_FILTER: *out = v->kind == JV_STR && jinja_filter_find(v->u.s->data) >= 0; return true;
    case T_TEST: *out = v->kind == JV_STR && jinja_test_find(v->u.s->data) >= 0; return true;
    default: return jr_fail(r, STATUS_INVALID, "unknown test");
    }
}

/* ---- printf-style formatting ----------------------------------------------------------------- */

static bool pct_pad(struct jbuf *b, const char *s, size_t n, size_t width, bool left, char fill)
{
    size_t len = jtext_count_cp(s, n);
    size_t pad = width > len ? width - len : 0;
    bool ok = true;
    if (!left)
        for (size_t i = 0; ok && i < pad; i++)
            ok = jbuf_putc(b, fill);
    ok = ok && jbuf_put(b, s, n);
    if (left)
        for (size_t i = 0; ok && i < pad; i++)
            ok = jbuf_putc(b, ' ');
    return ok;
}

/* %d %i %u %x %X %o of Python's printf-style formatting. */
static bool pct_int(struct jbuf *b, int64_t v, char conv, bool left, bool plus, bool space, bool alt,
                    bool zero, size_t width, int prec)
{
    char digits[80], body[200];
    uint64_t mag = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    unsigned base = conv == 'x' || conv == 'X' ? 16 : conv == 'o' ? 8 : 10;
    const char *set = conv == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
    size_t nd = 0;
    do {
        digits[nd++] = set[mag % base];
        mag /= base;
    } while (mag);
    const char *prefix = !alt ? "" : conv == 'x' ? "0x" : conv == 'X' ? "0X" : conv == 'o' ? "0o" : "";
    char sign = v < 0 ? '-' : plus ? '+' : space ? ' ' : 0;
    size_t pad_digits = prec > 0 && (size_t)prec > nd ? (size_t)prec - nd : 0;
    if (pad_digits > 100)
        pad_digits = 100;
    size_t len = (sign ? 1 : 0) + strlen(prefix) + pad_digits + nd;
    size_t fill = width > len ? width - len : 0;
    if (fill > 100000)
        fill = 100000;
    size_t k = 0;
    if (sign)
        body[k++] = sign;
    for (const char *q = prefix; *q; q++)
        body[k++] = *q;
    bool ok = true;
    if (!left && !zero)
        for (size_t i = 0; ok && i < fill; i++)
            ok = jbuf_putc(b, ' ');
    ok = ok && jbuf_put(b, body, k);
    if (!left && zero)
        for (size_t i = 0; ok && i < fill; i++)
            ok = jbuf_putc(b, '0');
    for (size_t i = 0; ok && i < pad_digits; i++)
        ok = jbuf_putc(b, '0');
    for (size_t i = nd; ok && i-- > 0;)
        ok = jbuf_putc(b, digits[i]);
    for (size_t i = 0; ok && left && i < fill; i++)
        ok = jbuf_putc(b, ' ');
    return ok;
}

bool jinja_percent_format(struct jrender *r, const struct jv *fmt, const struct jv *args, struct jv *out)
{
    const char *f = fmt->u.s->data;
    size_t n = fmt->u.s->len;
    bool tuple = jv_is_seq(args, JV_SEQ_TUPLE);
    bool mapping = args->kind == JV_DICT;
    size_t n_args = tuple ? args->u.l->len : 1, next = 0;
    bool used_mapping = false;
    struct jbuf b = jr_buf();
    bool ok = true;
    for (size_t i = 0; ok && i < n;) {
        if (f[i] != '%') {
            size_t j = i;
            while (j < n && f[j] != '%')
                j++;
            ok = jbuf_put(&b, f + i, j - i) || jr_buf_fail(r, &b);
            i = j;
            continue;
        }
        i++;
        const struct jv *arg = NULL;
        if (i < n && f[i] == '(') {
            size_t j = i + 1;
            while (j < n && f[j] != ')')
                j++;
            if (j < n && args->kind == JV_UNDEFINED) { /* Undefined[key] */
                ok = jr_undefined_error(r, args);
                break;
            }
            if (j >= n || !mapping) {
                ok = jr_fail(r, STATUS_INVALID,
                             j >= n ? "incomplete format key" : "format requires a mapping");
                break;
            }
            arg = jv_dict_get_str(args->u.d, f + i + 1, j - i - 1);
            if (!arg) {
                ok = jr_fail(r, STATUS_INVALID, "KeyError: '%.*s'", (int)(j - i - 1), f + i + 1);
                break;
            }
            used_mapping = true;
            i = j + 1;
        }
        bool left = false, plus = false, space = false, alt = false, zero = false;
        for (; i < n && strchr("-+ #0", f[i]); i++) {
            left |= f[i] == '-';
            plus |= f[i] == '+';
            space |= f[i] == ' ';
            alt |= f[i] == '#';
            zero |= f[i] == '0';
        }
        size_t width = 0;
        int prec = -1;
        while (i < n && f[i] >= '0' && f[i] <= '9' && width < 100000)
            width = width * 10 + (size_t)(f[i++] - '0');
        if (i < n && f[i] == '.') {
            i++;
            prec = 0;
            while (i < n && f[i] >= '0' && f[i] <= '9' && prec < 1000)
                prec = prec * 10 + (f[i++] - '0');
        }
        while (i < n && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L'))
            i++;
        if (i >= n) {
            ok = jr_fail(r, STATUS_INVALID, "incomplete format");
            break;
        }
        char conv = f[i++];
        if (conv == '%') {
            ok = jbuf_putc(&b, '%') || jr_buf_fail(r, &b);
            continue;
        }
        if (!arg) {
            if (next >= n_args) {
                ok = jr_fail(r, STATUS_INVALID, "not enough arguments for format string");
                break;
            }
            arg = tuple ? &args->u.l->items[next] : args;
            next++;
        }
        char num[512], spec[32];
        switch (conv) {
        case 's':
        case 'r':
        case 'a': {
            struct jbuf sb = jr_buf();
            ok = conv == 's' ? jv_to_str(&sb, arg) : jv_repr(&sb, arg);
            if (!ok) {
                jr_buf_fail(r, &sb);
                jbuf_free(&sb);
                break;
            }
            size_t len = sb.len;
            if (prec >= 0)
                len = jtext_cp_offset(sb.p ? sb.p : "", sb.len, (size_t)prec);
            ok = pct_pad(&b, sb.p ? sb.p : "", len, width, left, ' ') || jr_buf_fail(r, &b);
            jbuf_free(&sb);
            break;
        }
        case 'd':
        case 'i':
        case 'u':
        case 'x':
        case 'X':
        case 'o':
        case 'c': {
            int64_t v;
            if (arg->kind == JV_FLOAT && conv != 'x' && conv != 'X' && conv != 'o' && conv != 'c') {
                if (!isfinite(arg->u.f) || fabs(arg->u.f) >= 9.2e18) {
                    ok = jr_fail(r, STATUS_INVALID, "cannot convert float to integer");
                    break;
                }
                v = (int64_t)arg->u.f;
            } else if (conv == 'c' && arg->kind == JV_STR) {
                if (jtext_count_cp(arg->u.s->data, arg->u.s->len) != 1) {
                    ok = jr_fail(r, STATUS_INVALID, "%%c requires int or char");
                    break;
                }
                ok = pct_pad(&b, arg->u.s->data, arg->u.s->len, width, left, ' ') || jr_buf_fail(r, &b);
                break;
            } else if (arg->kind == JV_INT || arg->kind == JV_BOOL) {
                v = arg->kind == JV_INT ? arg->u.i : arg->u.b;
            } else {
                ok = jr_fail(r, STATUS_INVALID, "%%%c format: a real number is required, not %s", conv,
                             jv_type_name(arg));
                break;
            }
            if (conv == 'c') {
                if (v < 0 || v > 0x10FFFF) {
                    ok = jr_fail(r, STATUS_INVALID, "%%c arg not in range(0x110000)");
                    break;
                }
                struct jbuf cb = {0};
                ok = jbuf_put_cp(&cb, (uint32_t)v) && pct_pad(&b, cb.p, cb.len, width, left, ' ');
                jbuf_free(&cb);
                if (!ok)
                    jr_buf_fail(r, &b);
                break;
            }
            ok = pct_int(&b, v, conv, left, plus, space, alt, zero, width, prec) || jr_buf_fail(r, &b);
            break;
        }
        case 'e':
        case 'E':
        case 'f':
        case 'F':
        case 'g':
        case 'G': {
            if (!jv_is_number(arg)) {
                ok = jr_fail(r, STATUS_INVALID, "must be real number, not %s", jv_type_name(arg));
                break;
            }
            snprintf(spec, sizeof spec, "%%%s%s%s%s%s*.*%c", left ? "-" : "", plus ? "+" : "",
                     space ? " " : "", alt ? "#" : "", zero && !left ? "0" : "", conv);
            snprintf(num, sizeof num, spec, (int)(width > 400 ? 400 : width),
                     prec < 0 ? 6 : (prec > 300 ? 300 : prec), jv_as_double(arg));
            ok = jbuf_puts(&b, num) || jr_buf_fail(r, &b);
            break;
        }
        default: ok = jr_fail(r, STATUS_INVALID, "unsupported format character '%c'", conv); break;
        }
    }
    if (ok && tuple && next < n_args)
        ok = jr_fail(r, STATUS_INVALID, "not all arguments converted during string formatting");
    /* a lone argument left unused is an error unless it has __getitem__ */
    if (ok && !tuple && !mapping && next == 0 && !used_mapping && !jv_is_seq(args, JV_SEQ_LIST) &&
        args->kind != JV_UNDEFINED)
        ok = jr_fail(r, STATUS_INVALID, "not all arguments converted during string formatting");
    if (ok)
        ok = jr_str_from_buf(r, &b, out);
    jbuf_free(&b);
    return ok;
}

/* str.format: {} {0} {name} with optional !s/!r; no format specs. */
static bool str_format(struct jrender *r, const struct jv *self, const struct jargs *a, struct jv *out)
{
    const char *f = self->u.s->data;
    size_t n = self->u.s->len, auto_idx = 0;
    struct jbuf b = jr_buf();
    bool ok = true;
    for (size_t i = 0; ok && i < n;) {
        char c = f[i];
        if ((c == '{' || c == '}') && i + 1 < n && f[i + 1] == c) {
            ok = jbuf_putc(&b, c) || jr_buf_fail(r, &b);
            i += 2;
            continue;
        }
        if (c == '}') {
            ok = jr_fail(r, STATUS_INVALID, "Single '}' encountered in format string");
            break;
        }
        if (c != '{') {
            ok = jbuf_putc(&b, c) || jr_buf_fail(r, &b);
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && f[j] != '}' && f[j] != '!' && f[j] != ':')
            j++;
        const char *name = f + i + 1;
        size_t nl = j - i - 1;
        char conv = 's';
        if (j < n && f[j] == '!') {
            if (j + 1 < n)
                conv = f[j + 1];
            j += 2;
        }
        if (j < n && f[j] == ':') {
            ok = jr_fail(r, STATUS_INVALID, "str.format specs are not supported");
            break;
        }
        if (j >= n || f[j] != '}') {
            ok = jr_fail(r, STATUS_INVALID, "expected '}' before end of string");
            break;
        }
        const struct jv *arg = NULL;
        if (nl == 0) {
            if (auto_idx < a->n_pos)
                arg = &a->pos[auto_idx];
            auto_idx++;
        } else if (name[0] >= '0' && name[0] <= '9') {
            int64_t idx;
            if (parse_py_int(name, nl, 10, &idx) && idx >= 0 && (size_t)idx < a->n_pos)
                arg = &a->pos[idx];
        } else {
            for (size_t k = 0; k < a->n_kw; k++)
                if (strlen(a->kw_names[k]) == nl && !memcmp(a->kw_names[k], name, nl))
                    arg = &a->kw_vals[k];
        }
        if (!arg) {
            ok = jr_fail(r, STATUS_INVALID, "format: missing argument '%.*s'", (int)nl, name);
            break;
        }
        ok = (conv == 'r' || conv == 'a' ? jv_repr(&b, arg) : jv_to_str(&b, arg)) || jr_buf_fail(r, &b);
        i = j + 1;
    }
    if (ok)
        ok = jr_str_from_buf(r, &b, out);
    jbuf_free(&b);
    return ok;
}

/* ---- methods --------------------------------------------------------------------------------- */

static bool starts_ends(struct jrender *r, const struct jv *self, const struct jargs *args, bool ends,
                        struct jv *out)
{
    BIND(ends ? "endswith" : "startswith", "prefix", "start", "end");
    if (!p[0])
        return jr_fail(r, STATUS_INVALID, "%s() takes at least 1 argument", ends ? "endswith" : "startswith");
    size_t a, b, cpa;
    const char *s = self->u.s->data;
    if (!str_range(r, s, self->u.s->len, p[1], p[2], &a, &b, &cpa))
        return false;
    const struct jv *cands = p[0];
    size_t nc = 1;
    if (jv_is_seq(cands, JV_SEQ_TUPLE))
        nc = cands->u.l->len;
    else if (cands->kind != JV_STR)
        return jr_fail(r, STATUS_INVALID, "%s first arg must be str or a tuple of str, not %s",
                       ends ? "endswith" : "startswith", jv_type_name(cands));
    bool res = false;
    for (size_t k = 0; k < nc && !res; k++) {
        const struct jv *c = cands->kind == JV_STR ? cands : &cands->u.l->items[k];
        if (c->kind != JV_STR)
            return jr_fail(r, STATUS_INVALID, "tuple for %s must only contain str",
                           ends ? "endswith" : "startswith");
        size_t cn = c->u.s->len;
        if (a > b || b - a < cn)
            continue;
        res = ends ? !memcmp(s + b - cn, c->u.s->data, cn) : !memcmp(s + a, c->u.s->data, cn);
    }
    *out = jv_bool(res);
    return true;
}

static bool str_find(struct jrender *r, const struct jv *self, const struct jargs *args, int id,
                     struct jv *out)
{
    BIND(method_names[id], "sub", "start", "end");
    if (!p[0] || !need_str(r, p[0], "substring"))
        return p[0] ? false : jr_fail(r, STATUS_INVALID, "%s() takes at least 1 argument", method_names[id]);
    const char *s = self->u.s->data;
    size_t a, b, cpa;
    if (!str_range(r, s, self->u.s->len, p[1], p[2], &a, &b, &cpa))
        return false;
    const char *sub = p[0]->u.s->data;
    size_t sn = p[0]->u.s->len;
    if (!jr_step(r, 1 + self->u.s->len / 64))
        return false;
    if (id == M_COUNT) {
        int64_t count = 0;
        if (a > b) {
            *out = jv_int(0);
            return true;
        }
        if (sn == 0) {
            *out = jv_int((int64_t)jtext_count_cp(s + a, b - a) + 1);
            return true;
        }
        for (size_t i = a; i + sn <= b;) {
            const char *hit = memmem(s + i, b - i, sub, sn);
            if (!hit)
                break;
            count++;
            i = (size_t)(hit - s) + sn;
        }
        *out = jv_int(count);
        return true;
    }
    int64_t found = -1;
    if (a <= b && b - a >= sn) {
        if (id == M_FIND || id == M_INDEX) {
            const char *hit = sn ? memmem(s + a, b - a, sub, sn) : s + a;
            if (hit)
                found = (int64_t)(cpa + jtext_count_cp(s + a, (size_t)(hit - (s + a))));
        } else {
            for (size_t k = b - sn + 1; k-- > a;) {
                if (!memcmp(s + k, sub, sn)) {
                    found = (int64_t)(cpa + jtext_count_cp(s + a, k - a));
                    break;
                }
            }
        }
    }
    if (found < 0 && id == M_INDEX)
        return jr_fail(r, STATUS_INVALID, "substring not found");
    *out = jv_int(found);
    return true;
}

static bool str_class(struct jrender *r, const struct jv *self, int id, struct jv *out)
{
    const char *s = self->u.s->data;
    size_t n = self->u.s->len;
    if (id == M_ISLOWER || id == M_ISUPPER) {
        bool res;
        if (!str_all_cased(r, self, id == M_ISUPPER, &res))
            return false;
        *out = jv_bool(res);
        return true;
    }
    bool res = n > 0;
    for (size_t i = 0; res && i < n;) {
        uint32_t cp;
        i += jtext_decode(s + i, n - i, &cp);
        switch (id) {
        case M_ISDIGIT: res = cp >= '0' && cp <= '9'; break;
        case M_ISSPACE: res = jtext_isspace(cp); break;
        case M_ISALPHA: res = jtext_isalnum(cp) && !(cp >= '0' && cp <= '9'); break;
        default: res = jtext_isalnum(cp); break;
        }
    }
    *out = jv_bool(res);
    return true;
}

static bool str_join(struct jrender *r, const struct jv *self, const struct jargs *args, struct jv *out)
{
    BIND("join", "iterable");
    if (!p[0])
        return jr_fail(r, STATUS_INVALID, "join() takes exactly one argument");
    struct jv items;
    if (!jr_iterate(r, p[0], &items))
        return false;
    struct jbuf b = jr_buf();
    bool ok = true;
    for (size_t i = 0; ok && i < items.u.l->len; i++) {
        const struct jv *x = &items.u.l->items[i];
        if (x->kind != JV_STR) {
            ok = jr_fail(r, STATUS_INVALID, "sequence item %zu: expected str instance, %s found", i,
                         jv_type_name(x));
            break;
        }
        if ((i && !jbuf_put(&b, self->u.s->data, self->u.s->len)) || !jbuf_put(&b, x->u.s->data, x->u.s->len))
            ok = jr_buf_fail(r, &b);
    }
    if (ok)
        ok = jr_str_from_buf(r, &b, out);
    jbuf_free(&b);
    jv_decref(items);
    return ok;
}

static bool str_splitlines(struct jrender *r, const struct jv *self, const struct jargs *args, struct jv *out)
{
    BIND("splitlines", "keepends");
    bool keep = p[0] && jv_truthy(p[0]);
    const char *s = self->u.s->data;
    size_t n = self->u.s->len;
    if (!new_list(r, out, 4, JV_SEQ_LIST))
        return false;
    bool ok = true;
    for (size_t i = 0; ok && i < n;) {
        size_t j = i, brk = n, next = n;
        while (j < n) {
            uint32_t cp;
            size_t l = jtext_decode(s + j, n - j, &cp);
            if (jtext_islinebreak(cp)) {
                brk = j;
                next = j + l;
                if (cp == '\r' && next < n && s[next] == '\n')
                    next++;
                break;
            }
            j += l;
        }
        struct jv line;
        ok = jr_str_new(r, s + i, (keep ? next : brk) - i, &line) && jr_list_push(r, out, line);
        i = next;
    }
    if (!ok)
        jv_decref(*out);
    return ok;
}

static bool method_str(struct jrender *r, int id, const struct jv *self, const struct jargs *args,
                       struct jv *out)
{
    const char *s = self->u.s->data;
    size_t n = self->u.s->len;
    switch (id) {
    case M_UPPER:
    case M_LOWER:
    case M_CAPITALIZE:
    case M_TITLE:
    case M_SWAPCASE:
        if (!no_args(r, method_names[id], args))
            return false;
        return str_case(r, self,
                        id == M_UPPER        ? CASE_UPPER
                        : id == M_LOWER      ? CASE_LOWER
                        : id == M_CAPITALIZE ? CASE_CAPITALIZE
                        : id == M_TITLE      ? CASE_PYTITLE
                                             : CASE_SWAP,
                        out);
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP: {
        BIND(method_names[id], "chars");
        bool chars = !is_none(p[0]);
        if (chars && !need_str(r, p[0], "strip arg"))
            return false;
        size_t a, b;
        py_strip(s, n, chars ? p[0]->u.s->data : NULL, chars ? p[0]->u.s->len : 0, id != M_RSTRIP,
                 id != M_LSTRIP, &a, &b);
        return jr_str_new(r, s + a, b - a, out);
    }
    case M_SPLIT:
    case M_RSPLIT: {
        BIND(method_names[id], "sep", "maxsplit");
        int64_t maxsplit = -1;
        if (!is_none(p[1]) && !get_int(r, p[1], &maxsplit))
            return false;
        if (!is_none(p[0]) && !need_str(r, p[0], "separator"))
            return false;
        bool sep = !is_none(p[0]);
        return str_split(r, s, n, sep ? p[0]->u.s->data : NULL, sep ? p[0]->u.s->len : 0, maxsplit,
                         id == M_RSPLIT, out);
    }
    case M_SPLITLINES: return str_splitlines(r, self, args, out);
    case M_STARTSWITH: return starts_ends(r, self, args, false, out);
    case M_ENDSWITH: return starts_ends(r, self, args, true, out);
    case M_REPLACE: {
        BIND("replace", "old", "new", "count");
        if (!p[0] || !p[1])
            return jr_fail(r, STATUS_INVALID, "replace() takes at least 2 arguments");
        if (!need_str(r, p[0], "replace() argument 1") || !need_str(r, p[1], "replace() argument 2"))
            return false;
        int64_t count = -1;
        if (p[2] && !get_int(r, p[2], &count))
            return false;
        return str_replace(r, s, n, p[0]->u.s->data, p[0]->u.s->len, p[1]->u.s->data, p[1]->u.s->len, count,
                           out);
    }
    case M_FIND:
    case M_RFIND:
    case M_INDEX:
    case M_COUNT: return str_find(r, self, args, id, out);
    case M_ISALNUM:
    case M_ISALPHA:
    case M_ISDIGIT:
    case M_ISLOWER:
    case M_ISSPACE:
    case M_ISUPPER: return no_args(r, method_names[id], args) && str_class(r, self, id, out);
    case M_JOIN: return str_join(r, self, args, out);
    case M_FORMAT: return str_format(r, self, args, out);
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        BIND(method_names[id], "affix");
        if (!p[0] || !need_str(r, p[0], "argument"))
            return p[0] ? false
                        : jr_fail(r, STATUS_INVALID, "%s() takes exactly one argument", method_names[id]);
        size_t an = p[0]->u.s->len;
        if (an <= n && id == M_REMOVEPREFIX && !memcmp(s, p[0]->u.s->data, an))
            return jr_str_new(r, s + an, n - an, out);
        if (an <= n && id == M_REMOVESUFFIX && !memcmp(s + n - an, p[0]->u.s->data, an))
            return jr_str_new(r, s, n - an, out);
        *out = jv_copy(*self);
        return true;
    }
    case M_CENTER:
    case M_LJUST:
    case M_RJUST: {
        BIND(method_names[id], "width", "fillchar");
        int64_t w = 0;
        if (!p[0])
            return jr_fail(r, STATUS_INVALID, "%s() takes at least 1 argument", method_names[id]);
        if (!get_int(r, p[0], &w))
            return false;
        const char *fill = " ";
        size_t fill_n = 1;
        if (p[1]) {
            if (p[1]->kind != JV_STR || jtext_count_cp(p[1]->u.s->data, p[1]->u.s->len) != 1)
                return jr_fail(r, STATUS_INVALID, "The fill character must be exactly one character long");
            fill = p[1]->u.s->data;
            fill_n = p[1]->u.s->len;
        }
        return str_pad(r, self, w, fill, fill_n, id == M_LJUST ? -1 : id == M_RJUST ? 1 : 0, out);
    }
    case M_ZFILL: {
        BIND("zfill", "width");
        int64_t w = 0;
        if (!p[0])
            return jr_fail(r, STATUS_INVALID, "zfill() takes exactly one argument");
        if (!get_int(r, p[0], &w))
            return false;
        size_t len = jtext_count_cp(s, n);
        if (w <= (int64_t)len) {
            *out = jv_copy(*self);
            return true;
        }
        if (w > (int64_t)JINJA_MAX_OUTPUT)
            return jr_fail(r, STATUS_INVALID, "string too long");
        struct jbuf b = jr_buf();
        size_t sign = n && (s[0] == '+' || s[0] == '-');
        bool ok = jbuf_put(&b, s, sign);
        for (size_t k = len; ok && k < (size_t)w; k++)
            ok = jbuf_putc(&b, '0');
        ok = ok && jbuf_put(&b, s + sign, n - sign);
        ok = ok ? jr_str_from_buf(r, &b, out) : jr_buf_fail(r, &b);
        jbuf_free(&b);
        return ok;
    }
    default: return jr_fail(r, STATUS_INVALID, "unknown str method");
    }
}

bool jinja_method_call(struct jrender *r, int id, const struct jv *self, const struct jargs *args,
                       struct jv *out)
{
    if (id == M_UNSAFE)
        return jr_fail(r, STATUS_INVALID, "this method of a '%s' is unsafe in the sandbox",
                       jv_type_name(self));
    if (self->kind == JV_STR)
        return method_str(r, id, self, args, out);
    switch (id) {
    case M_D_COPY:
    case M_L_COPY:
        if (!no_args(r, "copy", args))
            return false;
        if (self->kind == JV_LIST) /* a fresh list; never a tuple */
            return jr_iterate(r, self, out);
        *out = jv_copy(*self);
        return true;
    case M_D_GET: {
        BIND("get", "key", "default");
        if (!p[0])
            return jr_fail(r, STATUS_INVALID, "get expected at least 1 argument, got 0");
        if (!jr_hashable(r, p[0]))
            return false;
        const struct jv *v = jv_dict_get(self->u.d, p[0]);
        *out = v ? jv_copy(*v) : p[1] ? jv_copy(*p[1]) : jv_none();
        return true;
    }
    case M_D_ITEMS:
        if (!no_args(r, "items", args) || !f_items(r, self, out))
            return false;
        out->u.l->seq = JV_SEQ_ITEMS;
        return true;
    case M_D_KEYS:
        if (!no_args(r, "keys", args) || !new_list(r, out, self->u.d->len, JV_SEQ_KEYS))
            return false;
        for (size_t i = 0; i < self->u.d->len; i++)
            if (!jr_list_push(r, out, jv_copy(self->u.d->e[i].key))) {
                jv_decref(*out);
                return false;
            }
        return true;
    case M_D_VALUES: {
        if (!no_args(r, "values", args) || !new_list(r, out, self->u.d->len, JV_SEQ_VALUES))
            return false;
        for (size_t i = 0; i < self->u.d->len; i++)
            if (!jr_list_push(r, out, jv_copy(self->u.d->e[i].val))) {
                jv_decref(*out);
                return false;
            }
        return true;
    }
    case M_L_COUNT:
    case M_L_INDEX: {
        BIND(method_names[id], "value");
        if (!p[0])
            return jr_fail(r, STATUS_INVALID, "%s() takes exactly one argument", method_names[id]);
        int64_t count = 0, first = -1;
        for (size_t i = 0; i < self->u.l->len; i++) {
            if (jv_equal(&self->u.l->items[i], p[0])) {
                if (first < 0)
                    first = (int64_t)i;
                count++;
            }
        }
        if (id == M_L_INDEX && first < 0)
            return jr_fail(r, STATUS_INVALID, "value is not in list");
        *out = jv_int(id == M_L_COUNT ? count : first);
        return jr_step(r, self->u.l->len / 16);
    }
    case M_LOOP_CYCLE: {
        if (args->n_kw || args->n_pos == 0)
            return jr_fail(r, STATUS_INVALID, "no items for cycling given");
        *out = jv_copy(args->pos[self->u.loop->index0 % args->n_pos]);
        return true;
    }
    case M_LOOP_CHANGED: {
        struct jv now;
        if (!new_list(r, &now, args->n_pos, JV_SEQ_LIST))
            return false;
        for (size_t i = 0; i < args->n_pos; i++)
            if (!jr_list_push(r, &now, jv_copy(args->pos[i]))) {
                jv_decref(now);
                return false;
            }
        struct jv_loop *lp = self->u.loop;
        bool changed = !lp->has_last || !jv_equal(&lp->last, &now);
        if (changed) {
            if (lp->has_last)
                jv_decref(lp->last);
            lp->last = now;
            lp->has_last = true;
        } else {
            jv_decref(now);
        }
        *out = jv_bool(changed);
        return true;
    }
    default: return jr_fail(r, STATUS_INVALID, "unknown method");
    }
}

/* ---- global functions ------------------------------------------------------------------------ */

/* dict(...) and namespace(...): an optional mapping or list of pairs, then keywords. */
static bool make_mapping(struct jrender *r, const struct jargs *args, enum jv_kind kind, struct jv *out)
{
    if (args->n_pos > 1)
        return jr_fail(r, STATUS_INVALID, "expected at most 1 positional argument, got %zu", args->n_pos);
    if (!jv_dict_new(out, kind))
        return jr_nomem(r);
    bool ok = true;
    if (args->n_pos == 1) {
        const struct jv *src = &args->pos[0];
        if (src->kind == JV_DICT || src->kind == JV_NS) {
            for (size_t i = 0; ok && i < src->u.d->len; i++)
                ok = jr_dict_set(r, out, jv_copy(src->u.d->e[i].key), jv_copy(src->u.d->e[i].val));
        } else {
            struct jv items;
            ok = jr_iterate(r, src, &items);
            bool have_items = ok;
            for (size_t i = 0; ok && i < items.u.l->len; i++) {
                struct jv kv;
                ok = jr_iterate(r, &items.u.l->items[i], &kv);
                if (!ok)
                    break;
                if (kv.u.l->len != 2)
                    ok = jr_fail(r, STATUS_INVALID,
                                 "dictionary update sequence element #%zu has length %zu; 2 is required", i,
                                 kv.u.l->len);
                else
                    ok = jr_dict_set(r, out, jv_copy(kv.u.l->items[0]), jv_copy(kv.u.l->items[1]));
                jv_decref(kv);
            }
            if (have_items)
                jv_decref(items);
        }
    }
    for (size_t k = 0; ok && k < args->n_kw; k++) {
        struct jv key;
        ok = jr_str_new(r, args->kw_names[k], strlen(args->kw_names[k]), &key) &&
             jr_dict_set(r, out, key, jv_copy(args->kw_vals[k]));
    }
    if (ok && kind == JV_NS && jv_contains_ns(out)) {
        /* the namespace itself is fine; any nested one is not */
        for (size_t i = 0; ok && i < out->u.d->len; i++)
            if (jv_contains_ns(&out->u.d->e[i].val))
                ok = jr_fail(r, STATUS_UNSUPPORTED, "a namespace holding another namespace is not supported");
    }
    if (!ok)
        jv_decref(*out);
    return ok;
}

static bool g_range(struct jrender *r, const struct jargs *args, struct jv *out)
{
    if (args->n_kw)
        return jr_fail(r, STATUS_INVALID, "range() takes no keyword arguments");
    if (args->n_pos < 1 || args->n_pos > 3)
        return jr_fail(r, STATUS_INVALID, "range expected 1 to 3 arguments, got %zu", args->n_pos);
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < args->n_pos; i++)
        if (!get_int(r, &args->pos[i], &v[i]))
            return false;
    int64_t start = 0, stop, step = 1;
    if (args->n_pos == 1) {
        stop = v[0];
    } else {
        start = v[0];
        stop = v[1];
        if (args->n_pos == 3)
            step = v[2];
    }
    if (step == 0)
        return jr_fail(r, STATUS_INVALID, "range() arg 3 must not be zero");
    uint64_t count = 0;
    if (step > 0 && start < stop)
        count = ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1;
    else if (step < 0 && start > stop)
        count = ((uint64_t)start - (uint64_t)stop - 1) / (0 - (uint64_t)step) + 1;
    if (count > JINJA_MAX_RANGE)
        return jr_fail(r, STATUS_INVALID,
                       "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
                       JINJA_MAX_RANGE);
    if (!jr_step(r, count / 16) || !new_list(r, out, (size_t)count, JV_SEQ_LIST))
        return false;
    for (uint64_t i = 0; i < count; i++)
        if (!jr_list_push(r, out, jv_int(start + (int64_t)i * step))) {
            jv_decref(*out);
            return false;
        }
    return true;
}

static bool g_strftime_now(struct jrender *r, const struct jargs *args, struct jv *out)
{
    if (args->n_pos != 1 || args->n_kw || args->pos[0].kind != JV_STR)
        return jr_fail(r, STATUS_INVALID, "strftime_now() takes one format string");
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm))
        return jr_fail(r, STATUS_INVALID, "strftime_now(): no local time");
    char buf[1024];
    const char *fmt = args->pos[0].u.s->data;
    if (args->pos[0].u.s->len > 256)
        return jr_fail(r, STATUS_INVALID, "strftime_now(): format too long");
    size_t n = fmt[0] ? strftime(buf, sizeof buf, fmt, &tm) : 0;
    return jr_str_new(r, buf, n, out);
}

bool jinja_global_call(struct jrender *r, int id, const struct jargs *args, struct jv *out)
{
    switch (id) {
    case G_RANGE: return g_range(r, args, out);
    case G_DICT: return make_mapping(r, args, JV_DICT, out);
    case G_NAMESPACE: return make_mapping(r, args, JV_NS, out);
    case G_STRFTIME_NOW: return g_strftime_now(r, args, out);
    case G_RAISE_EXCEPTION: {
        if (args->n_pos < 1)
            return jr_raise(r, "raise_exception() called without a message", 42);
        struct jv s;
        if (!jr_to_str(r, &args->pos[0], &s))
            return false;
        jr_raise(r, s.u.s->data, s.u.s->len);
        jv_decref(s);
        return false;
    }
    default: return jr_fail(r, STATUS_INVALID, "unknown global function");
    }
}
