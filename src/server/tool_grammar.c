/* tool_grammar.c — see tool_grammar.h.
 *
 * qwen3: one grammar_json part per tool (the call's literal text around the arguments' JSON).
 *
 * glm45: the call is tag pairs, so it is built here, with grammar_json_sub for the JSON values:
 *   call   ::= "<tool_call>" NAME nl S_0 "</tool_call>"            nl ::= "" | "\n"
 *   pair_i ::= "<arg_key>" KEY_i "</arg_key>" nl "<arg_value>" VALUE_i "</arg_value>" nl
 *   S_i    ::= pair_i S_{i+1} | S_{i+1} (the latter where KEY_i is optional);  S_n ::= extra*
 * GLM-4.5's template writes every nl as "\n", GLM-4.7/5's as ""; either is taken (a mix too:
 * the parser reads all of them). Keys come in the order "properties" lists them (required ones
 * must appear, optional ones may be skipped), as grammar_json orders an object's members; then,
 * where the schema allows other keys (additionalProperties true or a schema, or absent with no
 * "properties", or no parameters schema at all), extra pairs whose key is one or more printable
 * ASCII characters without blanks, '<' or '>', and not a listed name (so that a listed key's
 * value always follows its schema).
 *
 * A value is what the template prints: a string parameter (tool_param_is_string: the parser
 * reads it as text, never JSON) is raw text: any UTF-8 text without NUL that does not contain
 * "</arg_value>" (an automaton over the tag's prefixes, one stack), or one of its enum / const
 * strings literally, or a format's text (date, time, date-time, uuid, email); with minLength /
 * maxLength (code points) the text also cannot contain "</" (a counted automaton knowing the
 * previous byte only). pattern is refused: grammar_regex matches JSON-escaped text. null cannot
 * be written for such a parameter (the parser reads "null" as the string), so nullable is moot.
 * Any other parameter is the JSON text of its schema (grammar_json), but for an enum / const: its
 * values as the template prints them (strings raw unless they read as JSON: then quoted, so that
 * they read back as strings). A string in another schema that allows one (anyOf, no "type") is
 * written quoted, not raw as the template would: it reads back as the same string, where raw
 * text could read as another JSON value. An extra key's value is raw
 * text (the parser takes JSON where it parses, else a string: what the template prints for any
 * value) or, under an additionalProperties schema, that schema's JSON text: the parser knows only
 * listed parameters as strings, so an extra string is written quoted to read back as one.
 *
 * Not checked: a JSON value's strings may contain "</arg_value>" (the template would print it
 * too; the parser would cut the value there); extra keys may repeat each other.
 */
#include "server/tool_grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_json.h"

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"
#define KEY_OPEN "<arg_key>"
#define KEY_CLOSE "</arg_key>"
#define VALUE_OPEN "<arg_value>"
#define VALUE_CLOSE "</arg_value>"

enum { GLM_MAX_LENGTH = 10000 /* minLength / maxLength of a raw-text value: two rules a character */ };

/* 400 or 500 from a compiler's status and message. */
static enum status compile_error(enum status st, const char *name, const struct err *err, struct api_error *e)
{
    if (st == STATUS_NOMEM)
        return api_error_set(e, 500, "server_error", NULL, NULL, "%s", err->msg);
    return api_error_set(e, 400, "invalid_request_error", "tools", st == STATUS_UNSUPPORTED ? "unsupported_parameter" : NULL,
                         "tool_choice forces a call of %s: %s", name ? name : "one of the tools", err->msg);
}

/* ---- qwen3 ---- */

static enum status qwen3_compile(const struct json *tools, const char *name, struct grammar **out,
                                 struct api_error *e)
{
    const int n_tools = (int)json_array_size(tools);
    struct grammar_json_part *parts = calloc((size_t)(n_tools ? n_tools : 1), sizeof *parts);
    char (*prefix)[128] = calloc((size_t)(n_tools ? n_tools : 1), sizeof *prefix);
    if (!parts || !prefix) {
        free(parts), free(prefix);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    int n = 0;
    for (const struct json *t = json_child(tools); t; t = json_next(t)) {
        const struct json *f = json_get(t, "function");
        const char *fn = json_string(json_get(f, "name")); /* checked: [A-Za-z0-9_-]{1,64}, no escaping */
        if (name && strcmp(fn, name) != 0)
            continue;
        snprintf(prefix[n], sizeof prefix[n], "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", fn);
        const struct json *p = json_get(f, "parameters");
        parts[n] = (struct grammar_json_part){.prefix = prefix[n], .schema = json_is_object(p) ? p : NULL,
                                              .suffix = "}\n</tool_call>"};
        n++;
    }
    struct err err = {0};
    char path[96];
    /* the schema's place in the request, for the compiler's messages */
    int at = 0;
    for (const struct json *t = json_child(tools); t; t = json_next(t), at++)
        if (!name || strcmp(json_string(json_get(json_get(t, "function"), "name")), name) == 0)
            break;
    snprintf(path, sizeof path, name ? "tools[%d].function.parameters" : "tools[].function.parameters", at);
    enum status st = grammar_json_compile(parts, n, &(struct grammar_json_opts){.path = path}, out, &err);
    free(parts), free(prefix);
    return st ? compile_error(st, name, &err, e) : STATUS_OK;
}

/* ---- glm45 ---- */

struct glm {
    struct gram_builder b;
    struct grammar_json_sub *sub;
    struct err err;              /* the first failure, ours or the sub's */
    enum status st;              /* ours (the sub's statuses are copied here) */
    int nl;                      /* "" | "\n" */
    int utf8;                    /* one non-ASCII character (the sub's rule) */
    int raw_any;                 /* raw text then </arg_value>, made on first use (-1 before) */
};

__attribute__((format(printf, 4, 5))) static int glm_fail(struct glm *g, enum status st, const char *path,
                                                          const char *fmt, ...)
{
    if (g->st != STATUS_OK)
        return -1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g->st = err_set(&g->err, st, "%s: %s", path, msg);
    return -1;
}

static bool glm_ok(const struct glm *g)
{
    return g->st == STATUS_OK;
}

/* ASCII 0x01..0x7f without the bytes of `but`. */
static struct gram_class ascii_but(const char *but)
{
    struct gram_class k = {{0}};
    gram_class_range(&k, 0x01, 0x7f);
    for (; *but; but++)
        k.w[(unsigned char)*but >> 6] &= ~(1ull << ((unsigned char)*but & 63));
    return k;
}

/* Alternatives of r: one character other than '<' and the bytes of `but` (an ASCII byte, or a
 * whole non-ASCII one), then rule next (-1: nothing). */
static void push_char_then(struct glm *g, int r, const char *but, int next)
{
    char ex[8];
    snprintf(ex, sizeof ex, "<%s", but);
    struct gram_class k = ascii_but(ex);
    int a = gram_alt(&g->b, r);
    gram_push_class(&g->b, a, &k);
    if (next >= 0)
        gram_push_ref(&g->b, a, next);
    a = gram_alt(&g->b, r);
    gram_push_ref(&g->b, a, g->utf8);
    if (next >= 0)
        gram_push_ref(&g->b, a, next);
}

/* Any text without NUL that does not contain `end`, then `end` (which starts with '<' and has no
 * other '<'): state k has read k bytes of end; a mismatch goes back to state 0, or to 1 on '<'. */
static int raw_text(struct glm *g, const char *end)
{
    int st[16];
    const int n = (int)strlen(end);
    ASSERT(n >= 2 && n <= 16 && end[0] == '<' && !strchr(end + 1, '<'));
    for (int k = 0; k < n; k++)
        st[k] = gram_rule(&g->b);
    push_char_then(g, st[0], "", st[0]);
    int a0 = gram_alt(&g->b, st[0]);
    gram_push_bytes(&g->b, a0, "<", 1);
    gram_push_ref(&g->b, a0, st[1]);
    for (int k = 1; k < n; k++) {
        int a = gram_alt(&g->b, st[k]);
        gram_push_bytes(&g->b, a, end + k, 1);
        if (k + 1 < n)
            gram_push_ref(&g->b, a, st[k + 1]);
        a = gram_alt(&g->b, st[k]);
        gram_push_bytes(&g->b, a, "<", 1);
        gram_push_ref(&g->b, a, st[1]);
        char but[2] = {end[k], 0};
        push_char_then(g, st[k], but, st[0]);
    }
    return st[0];
}

/* One character other than '<' and the bytes of `but`: an ASCII byte, or a whole non-ASCII one. */
static int char_rule(struct glm *g, const char *but)
{
    int r = gram_rule(&g->b);
    push_char_then(g, r, but, -1);
    return r;
}

/* Text of min..max characters (max -1: unbounded) without NUL or "</", then </arg_value>:
 * A_i / L_i have read i characters, the last not '<' / '<'. Eight elements a state: a string
 * of maxLength n costs 16 n of the grammar's GRAMMAR_MAX_ELEMS. */
static int raw_counted(struct glm *g, int min, int max)
{
    const int top = max >= 0 ? max : min;
    int *A = malloc(2 * (size_t)(top + 1) * sizeof *A);
    if (!A)
        return glm_fail(g, STATUS_NOMEM, "tools", "out of memory");
    int *L = A + top + 1;
    const int ch = char_rule(g, ""), ch_no_slash = char_rule(g, "/");
    const int close = gram_rule_bytes(&g->b, VALUE_CLOSE, strlen(VALUE_CLOSE));
    for (int i = 0; i <= top; i++)
        A[i] = gram_rule(&g->b), L[i] = gram_rule(&g->b);
    for (int i = 0; i <= top; i++) {
        if (i >= min) {
            gram_push_ref(&g->b, gram_alt(&g->b, A[i]), close);
            gram_push_ref(&g->b, gram_alt(&g->b, L[i]), close);
        }
        if (i == max)
            continue;
        const int next = i < top ? i + 1 : top; /* past min, unbounded: loop */
        for (int x = 0; x < 2; x++) {
            int a = gram_alt(&g->b, x ? L[i] : A[i]);
            gram_push_ref(&g->b, a, x ? ch_no_slash : ch);
            gram_push_ref(&g->b, a, A[next]);
            a = gram_alt(&g->b, x ? L[i] : A[i]);
            gram_push_bytes(&g->b, a, "<", 1);
            gram_push_ref(&g->b, a, L[next]);
        }
    }
    int r = A[0];
    free(A);
    return r;
}

static int seq_close(struct glm *g, int v)
{
    int r = gram_rule(&g->b);
    int a = gram_alt(&g->b, r);
    gram_push_ref(&g->b, a, v);
    gram_push_bytes(&g->b, a, VALUE_CLOSE, strlen(VALUE_CLOSE));
    return r;
}

/* A non-negative integer keyword of a string parameter (absent: dflt). */
static int length_keyword(struct glm *g, const struct json *s, const char *key, int dflt, const char *path)
{
    const struct json *j = json_get(s, key);
    if (!j)
        return dflt;
    double v = json_number(j);
    if (!json_is_number(j) || v < 0 || v != (double)(long long)v)
        return glm_fail(g, STATUS_INVALID, path, "'%s' must be a non-negative integer", key);
    if (v > GLM_MAX_LENGTH)
        return glm_fail(g, STATUS_UNSUPPORTED, path, "'%s' %.0f is larger than a glm45 string argument takes (%d)",
                        key, v, GLM_MAX_LENGTH);
    return (int)v;
}

/* The value of a string parameter with schema s, then </arg_value>. */
static int string_value(struct glm *g, const struct json *root, const struct json *s, const char *path)
{
    static const char *const KNOWN[] = {"type", "enum", "const", "format", "minLength", "maxLength", "nullable"};
    for (const struct json *k = json_child(s); k; k = json_next(k)) {
        bool known = grammar_json_is_annotation(json_key(k));
        for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0] && !known; i++)
            known = strcmp(json_key(k), KNOWN[i]) == 0;
        if (!known)
            return glm_fail(g, STATUS_UNSUPPORTED, path, "'%.64s' is not supported for a string argument (glm45 writes "
                            "it as raw text)", json_key(k));
    }
    const struct json *en = json_get(s, "enum"), *cn = json_get(s, "const");
    if (en && cn)
        return glm_fail(g, STATUS_UNSUPPORTED, path, "'enum' and 'const' together are not supported");
    if (en && (!json_is_array(en) || json_array_size(en) == 0))
        return glm_fail(g, STATUS_INVALID, path, "'enum' must be a non-empty array");
    if (en || cn) {
        int r = gram_rule(&g->b);
        for (const struct json *v = en ? json_child(en) : cn; v; v = en ? json_next(v) : NULL) {
            if (!json_is_string(v))
                return glm_fail(g, STATUS_INVALID, path, "'%s' of a string argument lists a value that is not a string",
                                en ? "enum" : "const");
            if (strstr(json_string(v), VALUE_CLOSE))
                return glm_fail(g, STATUS_UNSUPPORTED, path, "'%s' value \"%.64s\" contains \"" VALUE_CLOSE "\"",
                                en ? "enum" : "const", json_string(v));
            int a = gram_alt(&g->b, r);
            gram_push_bytes(&g->b, a, json_string(v), strlen(json_string(v)));
            gram_push_bytes(&g->b, a, VALUE_CLOSE, strlen(VALUE_CLOSE));
        }
        return r;
    }
    if (json_get(s, "format")) {
        int body = -1;
        enum status st = grammar_json_sub_format_text(g->sub, root, s, path, &body);
        if (st)
            return g->st = st, -1;
        return seq_close(g, body);
    }
    int min = length_keyword(g, s, "minLength", 0, path), max = length_keyword(g, s, "maxLength", -1, path);
    if (!glm_ok(g))
        return -1;
    if (max >= 0 && max < min)
        return glm_fail(g, STATUS_INVALID, path, "'maxLength' %d is below 'minLength' %d", max, min);
    if (min > 0 || max >= 0)
        return raw_counted(g, min, max);
    if (g->raw_any < 0)
        g->raw_any = raw_text(g, VALUE_CLOSE);
    return g->raw_any;
}

/* The JSON text of schema s (NULL: any value), then </arg_value>. */
static int json_value(struct glm *g, const struct json *root, const struct json *s, const char *path)
{
    int v = -1;
    enum status st = grammar_json_sub_value(g->sub, root, s, path, &v);
    if (st)
        return g->st = st, -1;
    return seq_close(g, v);
}

/* An enum / const of a parameter that is not a string one (no "type": "string"), then
 * </arg_value>: each value as the template prints it, a string raw, unless it reads as JSON (the
 * parser would take "12" for a number): then quoted; anything else its JSON text. The schema is
 * compiled by grammar_json too, for its refusals. */
static int literal_value(struct glm *g, const struct json *root, const struct json *s, const char *path)
{
    if (json_value(g, root, s, path) < 0)
        return -1;
    const struct json *en = json_get(s, "enum"), *cn = json_get(s, "const");
    int r = gram_rule(&g->b);
    for (const struct json *v = en ? json_child(en) : cn; v && glm_ok(g); v = en ? json_next(v) : NULL) {
        struct json *j = NULL;
        bool raw = json_is_string(v) &&
                   json_parse(json_string(v), strlen(json_string(v)), "enum", &j, NULL) != STATUS_OK;
        json_free(j);
        char *t = raw ? NULL : json_print(v, false);
        const char *text = raw ? json_string(v) : t;
        if (!text)
            return glm_fail(g, STATUS_NOMEM, path, "out of memory");
        if (strstr(text, VALUE_CLOSE))
            glm_fail(g, STATUS_UNSUPPORTED, path, "'%s' value \"%.64s\" contains \"" VALUE_CLOSE "\"",
                     en ? "enum" : "const", text);
        int a = gram_alt(&g->b, r);
        gram_push_bytes(&g->b, a, text, strlen(text));
        gram_push_bytes(&g->b, a, VALUE_CLOSE, strlen(VALUE_CLOSE));
        free(t);
    }
    return glm_ok(g) ? r : -1;
}

/* "<arg_key>" key "</arg_key>" nl "<arg_value>" value nl, key and value rules ending with their tags. */
static int pair(struct glm *g, int key, int value)
{
    int r = gram_rule(&g->b);
    int a = gram_alt(&g->b, r);
    gram_push_bytes(&g->b, a, KEY_OPEN, strlen(KEY_OPEN));
    gram_push_ref(&g->b, a, key);
    gram_push_ref(&g->b, a, g->nl);
    gram_push_bytes(&g->b, a, VALUE_OPEN, strlen(VALUE_OPEN));
    gram_push_ref(&g->b, a, value);
    gram_push_ref(&g->b, a, g->nl);
    return r;
}

/* The bytes an extra key is made of: printable ASCII without blanks, '<' or '>'. */
static struct gram_class key_class(void)
{
    struct gram_class k = {{0}};
    gram_class_range(&k, 0x21, 0x7e);
    k.w[0] &= ~(1ull << '<' | 1ull << '>');
    return k;
}

/* An extra key then </arg_key>: one or more key bytes, but none of the names p lists (an extra
 * key repeating one would take any value for it). A trie of the names: a node reads a child's
 * byte, or any other key byte into the free state F (any key bytes, then the tag); it ends the
 * key where it is not the end of a name. */
static int extra_key(struct glm *g, const struct json *p)
{
    const struct gram_class kc = key_class();
    int free_r = gram_rule(&g->b);
    int a = gram_alt(&g->b, free_r);
    gram_push_class(&g->b, a, &kc);
    gram_push_ref(&g->b, a, free_r);
    gram_push_bytes(&g->b, gram_alt(&g->b, free_r), KEY_CLOSE, strlen(KEY_CLOSE));
    size_t n_bytes = 0;
    for (const struct json *q = json_child(json_get(p, "properties")); q; q = json_next(q))
        n_bytes += strlen(json_key(q));
    struct node {
        int first, next; /* first child, next sibling (-1: none) */
        unsigned char byte;
        bool name;       /* a listed name ends here */
    } *t = malloc((n_bytes + 1) * sizeof *t);
    if (!t)
        return glm_fail(g, STATUS_NOMEM, "tools", "out of memory");
    int n = 1;
    t[0] = (struct node){.first = -1, .next = -1};
    for (const struct json *q = json_child(json_get(p, "properties")); q; q = json_next(q)) {
        const char *k = json_key(q);
        bool keyish = *k != 0;
        for (const char *c = k; *c && keyish; c++)
            keyish = gram_class_has(&kc, (unsigned char)*c);
        if (!keyish) /* no extra key can spell it */
            continue;
        int x = 0;
        for (const char *c = k; *c; c++) {
            int y = t[x].first;
            while (y >= 0 && t[y].byte != (unsigned char)*c)
                y = t[y].next;
            if (y < 0) {
                y = n++;
                t[y] = (struct node){.first = -1, .next = t[x].first, .byte = (unsigned char)*c};
                t[x].first = y;
            }
            x = y;
        }
        t[x].name = true;
    }
    int *rule = malloc((size_t)n * sizeof *rule);
    if (!rule) {
        free(t);
        return glm_fail(g, STATUS_NOMEM, "tools", "out of memory");
    }
    for (int x = 0; x < n; x++)
        rule[x] = gram_rule(&g->b);
    for (int x = 0; x < n; x++) {
        struct gram_class other = kc;
        for (int y = t[x].first; y >= 0; y = t[y].next) {
            other.w[t[y].byte >> 6] &= ~(1ull << (t[y].byte & 63));
            a = gram_alt(&g->b, rule[x]);
            gram_push_bytes(&g->b, a, (const char *)&t[y].byte, 1);
            gram_push_ref(&g->b, a, rule[y]);
        }
        a = gram_alt(&g->b, rule[x]);
        gram_push_class(&g->b, a, &other);
        gram_push_ref(&g->b, a, free_r);
        if (x > 0 && !t[x].name)
            gram_push_bytes(&g->b, gram_alt(&g->b, rule[x]), KEY_CLOSE, strlen(KEY_CLOSE));
    }
    int r = rule[0];
    free(rule), free(t);
    return r;
}

/* S_n: the extra pairs the schema p allows (none: the empty string). */
static int extras(struct glm *g, const struct json *p, const char *path)
{
    const struct json *addl = json_get(p, "additionalProperties");
    int r = gram_rule(&g->b);
    if (p && (addl ? json_is_bool(addl) && !json_bool(addl) : json_get(p, "properties") != NULL)) {
        gram_alt(&g->b, r);
        return r;
    }
    if (addl && !json_is_bool(addl) && !json_is_object(addl))
        return glm_fail(g, STATUS_INVALID, path, "'additionalProperties' must be a boolean or a schema");
    int value;
    if (json_is_object(addl)) {
        char sub[200];
        snprintf(sub, sizeof sub, "%s.additionalProperties", path);
        value = json_value(g, p, addl, sub);
    } else {
        if (g->raw_any < 0)
            g->raw_any = raw_text(g, VALUE_CLOSE);
        value = g->raw_any;
    }
    int one = pair(g, extra_key(g, p), value);
    gram_push_ref(&g->b, gram_alt(&g->b, r), gram_repeat(&g->b, one, -1, 0, -1));
    return r;
}

/* Whether a listed parameter's name reads back from <arg_key>NAME</arg_key> as itself (the parser
 * trims blanks around it). */
static bool key_writable(const char *k)
{
    size_t n = strlen(k);
    const char *blank = " \t\n\r";
    return !strstr(k, KEY_CLOSE) && !(n && (strchr(blank, k[0]) || strchr(blank, k[n - 1])));
}

/* One call of function fn with parameters p (NULL: any keys), p's place in messages at path. */
static int glm_call(struct glm *g, const char *fn, const struct json *p, const char *path)
{
    static const char *const KNOWN[] = {"type", "properties", "required", "additionalProperties", "$defs", "definitions"};
    const struct json *props = json_get(p, "properties"), *req = json_get(p, "required"), *type = json_get(p, "type");
    for (const struct json *k = json_child(p); k; k = json_next(k)) {
        bool known = grammar_json_is_annotation(json_key(k));
        for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0] && !known; i++)
            known = strcmp(json_key(k), KNOWN[i]) == 0;
        if (!known)
            return glm_fail(g, STATUS_UNSUPPORTED, path, "'%.64s' is not supported (glm45 writes arguments as key/value "
                            "tags: the parameters must be one object schema)", json_key(k));
    }
    if (type && !(json_is_string(type) && strcmp(json_string(type), "object") == 0))
        return glm_fail(g, STATUS_UNSUPPORTED, path, "'type' must be \"object\" (glm45 writes arguments as key/value tags)");
    if (props && !json_is_object(props))
        return glm_fail(g, STATUS_INVALID, path, "'properties' must be an object");
    if (req && !json_is_array(req))
        return glm_fail(g, STATUS_INVALID, path, "'required' must be an array of property names");
    for (const struct json *k = json_child(req); k; k = json_next(k)) {
        if (!json_is_string(k))
            return glm_fail(g, STATUS_INVALID, path, "'required' must be an array of property names");
        if (!json_get(props, json_string(k)))
            return glm_fail(g, STATUS_UNSUPPORTED, path, "'required' names \"%.64s\", which 'properties' does not define",
                            json_string(k));
    }
    int next = extras(g, p, path);
    int n = 0;
    for (const struct json *q = json_child(props); q; q = json_next(q))
        n++;
    const struct json **list = calloc((size_t)(n ? n : 1), sizeof *list);
    if (!list)
        return glm_fail(g, STATUS_NOMEM, path, "out of memory");
    n = 0;
    for (const struct json *q = json_child(props); q; q = json_next(q))
        list[n++] = q;
    for (int i = n - 1; i >= 0 && glm_ok(g); i--) { /* S_i from the last one back */
        const char *key = json_key(list[i]);
        char sub[200];
        snprintf(sub, sizeof sub, "%s.properties.%.64s", path, key);
        if (!key_writable(key)) {
            glm_fail(g, STATUS_UNSUPPORTED, sub, "the name cannot be written between <arg_key> tags (blanks around it, "
                     "or \"" KEY_CLOSE "\" in it)");
            break;
        }
        int value = tool_param_is_string(list[i])                                     ? string_value(g, p, list[i], sub)
                    : json_is_object(list[i]) && (json_get(list[i], "enum") || json_get(list[i], "const"))
                        ? literal_value(g, p, list[i], sub)
                        : json_value(g, p, list[i], sub);
        int kr = gram_rule(&g->b), a = gram_alt(&g->b, kr);
        gram_push_bytes(&g->b, a, key, strlen(key));
        gram_push_bytes(&g->b, a, KEY_CLOSE, strlen(KEY_CLOSE));
        bool required = false;
        for (const struct json *k = json_child(req); k && !required; k = json_next(k))
            required = strcmp(json_string(k), key) == 0;
        int s = gram_rule(&g->b);
        a = gram_alt(&g->b, s);
        gram_push_ref(&g->b, a, pair(g, kr, value));
        gram_push_ref(&g->b, a, next);
        if (!required)
            gram_push_ref(&g->b, gram_alt(&g->b, s), next);
        next = s;
    }
    free(list);
    int r = gram_rule(&g->b), a = gram_alt(&g->b, r);
    gram_push_bytes(&g->b, a, OPEN, strlen(OPEN));
    gram_push_bytes(&g->b, a, fn, strlen(fn));
    gram_push_ref(&g->b, a, g->nl);
    gram_push_ref(&g->b, a, next);
    gram_push_bytes(&g->b, a, CLOSE, strlen(CLOSE));
    return glm_ok(g) ? r : -1;
}

static enum status glm45_compile(const struct json *tools, const char *name, struct grammar **out,
                                 struct api_error *e)
{
    struct glm g = {.raw_any = -1};
    gram_builder_init(&g.b);
    enum status st = grammar_json_sub_init(&g.sub, &g.b, NULL, &g.err);
    if (st) {
        gram_builder_free(&g.b);
        return compile_error(st, name, &g.err, e);
    }
    g.utf8 = grammar_json_sub_utf8(g.sub);
    g.nl = gram_rule(&g.b);
    gram_alt(&g.b, g.nl);
    gram_push_bytes(&g.b, gram_alt(&g.b, g.nl), "\n", 1);
    int root = gram_rule(&g.b), i = 0;
    char path[64] = "tools[].function.parameters"; /* the named tool's, or all of them */
    for (const struct json *t = json_child(tools); t && glm_ok(&g); t = json_next(t), i++) {
        const struct json *f = json_get(t, "function");
        const char *fn = json_string(json_get(f, "name")); /* checked: [A-Za-z0-9_-]{1,64} */
        if (name && strcmp(fn, name) != 0)
            continue;
        snprintf(path, sizeof path, "tools[%d].function.parameters", i);
        const struct json *p = json_get(f, "parameters");
        int call = glm_call(&g, fn, json_is_object(p) ? p : NULL, path);
        gram_push_ref(&g.b, gram_alt(&g.b, root), call);
    }
    grammar_json_sub_free(g.sub);
    if (g.st) {
        gram_builder_free(&g.b);
        return compile_error(g.st, name, &g.err, e);
    }
    st = gram_builder_finish(&g.b, root, out, &g.err);
    if (st && !name)
        snprintf(path, sizeof path, "tools[].function.parameters");
    if (st)
        err_prefix(&g.err, "%s", path);
    return st ? compile_error(st, name, &g.err, e) : STATUS_OK;
}

enum status tool_grammar_compile(enum tool_format fmt, const struct json *tools, const char *name,
                                 struct grammar **out, struct api_error *e)
{
    *out = NULL;
    bool named = !name;
    for (const struct json *t = json_child(tools); t && !named; t = json_next(t))
        named = strcmp(json_string(json_get(json_get(t, "function"), "name")), name) == 0;
    if (!named || json_array_size(tools) == 0)
        return api_error_set(e, 400, "invalid_request_error", "tool_choice", NULL, "'tool_choice' names no tool of 'tools'");
    switch (fmt) {
    case TOOL_FORMAT_QWEN3: return qwen3_compile(tools, name, out, e);
    case TOOL_FORMAT_GLM45: return glm45_compile(tools, name, out, e);
    default:
        return api_error_set(e, 400, "invalid_request_error", "tool_choice", "unsupported_parameter",
                             "'tool_choice' forcing a call needs the model's call format (serve --tool-call-parser "
                             "qwen3|glm45); this server has none: use \"auto\"");
    }
}
