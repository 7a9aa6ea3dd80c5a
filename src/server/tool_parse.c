/* tool_parse.c — see tool_parse.h.
 *
 * One byte at a time through a state machine, so that where feeds split the text never matters.
 * Inside a call the bytes go to p->buf (the part being read) or, for parts whose text is skipped,
 * to the 15-byte p->tail that is enough to see a tag end; nothing inside a call reaches the
 * content until the call is known not to be one.
 */
#include "server/tool_parse.h"

#include <stdlib.h>
#include <string.h>

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"
#define MAX_NAME 256 /* a glm45 name longer than this (before its terminator) is not a call */
#define MAX_BODY_PREFIX 4096 /* qwen3: a name this long is read whole (the prefix is rescanned each byte) */

enum state {
    S_OUT,      /* content */
    Q_BODY,     /* qwen3: {"name": ..., "arguments": before the arguments' first byte */
    Q_ARGS,     /* qwen3: the arguments object, streamed */
    Q_TAIL,     /* qwen3: after the arguments, up to the closing tag */
    Q_WHOLE,    /* qwen3: another body, read whole up to the closing tag */
    G_NAME,     /* glm45: the function's name */
    G_BETWEEN,  /* glm45: before <arg_key> or the closing tag */
    G_KEY,      /* glm45: an argument's name, up to </arg_key> */
    G_AFTER_KEY, /* glm45: before <arg_value> */
    G_VALUE,    /* glm45: its value, up to </arg_value> */
};

static bool put(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return false;
        *buf = b, *cap = c;
    }
    if (n)
        memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

static char *dup0(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    return d ? memcpy(d, s, n) : NULL;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

static bool ends_with(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    return n >= t && memcmp(s + n - t, tag, t) == 0;
}

void tool_parse_init(struct tool_parse *p, enum tool_format fmt, const struct json *tools)
{
    memset(p, 0, sizeof *p);
    p->fmt = fmt;
    p->tools = tools;
    p->state = S_OUT;
}

void tool_parse_free(struct tool_parse *p)
{
    for (int i = 0; i < p->n_calls; i++)
        free(p->calls[i].name), free(p->calls[i].args);
    free(p->buf);
    free(p->key);
    free(p->content);
    memset(p, 0, sizeof *p);
}

bool tool_format_from_name(const char *name, enum tool_format *out)
{
    static const struct {
        const char *name;
        enum tool_format f;
    } NAMES[] = {{"none", TOOL_FORMAT_NONE}, {"qwen3", TOOL_FORMAT_QWEN3}, {"glm45", TOOL_FORMAT_GLM45}};
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (strcmp(name, NAMES[i].name) == 0) {
            *out = NAMES[i].f;
            return true;
        }
    return false;
}

const char *tool_format_name(enum tool_format f)
{
    return f == TOOL_FORMAT_QWEN3 ? "qwen3" : f == TOOL_FORMAT_GLM45 ? "glm45" : "none";
}

static bool content(struct tool_parse *p, const char *s, size_t n)
{
    return put(&p->content, &p->n_content, &p->cap_content, s, n);
}

/* The last bytes of a skipped part (enough for any tag); true when they end with tag. */
static bool tail_push(struct tool_parse *p, char c, const char *tag)
{
    if (p->n_tail == sizeof p->tail) {
        memmove(p->tail, p->tail + 1, sizeof p->tail - 1);
        p->n_tail--;
    }
    p->tail[p->n_tail++] = c;
    return ends_with(p->tail, p->n_tail, tag);
}

static void enter(struct tool_parse *p, enum state s)
{
    p->state = s;
    p->n_buf = 0;
    p->n_tail = 0;
}

/* A new call named name[0..n) (copied); false on no memory. */
static bool call_open(struct tool_parse *p, const char *name, size_t n)
{
    struct tool_call *c = &p->calls[p->n_calls];
    memset(c, 0, sizeof *c);
    if (!(c->name = malloc(n + 1)) || !put(&c->args, &c->n_args, &c->cap_args, "", 0)) {
        free(c->name);
        c->name = NULL;
        return false;
    }
    memcpy(c->name, name, n);
    c->name[n] = 0;
    p->n_calls++;
    return true;
}

static struct tool_call *current(struct tool_parse *p)
{
    return &p->calls[p->n_calls - 1];
}

static void call_close(struct tool_parse *p)
{
    current(p)->done = true;
    p->trim = true;
    enter(p, S_OUT);
}

/* The text of a call that turned out not to be one, back to the content. */
static bool give_back(struct tool_parse *p)
{
    bool ok = content(p, OPEN, strlen(OPEN)) && content(p, p->buf, p->n_buf);
    enter(p, S_OUT);
    return ok;
}

/* ---- qwen3 ---- */

/* How far body[0..n) matches `{"name": "<string>", "arguments": `: -1 it cannot, 0 it may (more
 * bytes needed), 1 it does and body[n - 1] is the arguments' first byte. *name / *n_name: the
 * name's JSON string (quotes included). */
static int qwen_prefix(const char *b, size_t n, size_t *name, size_t *n_name)
{
    size_t i = 0;
#define WS()                                                                                        \
    while (i < n && is_ws(b[i]))                                                                   \
        i++;                                                                                       \
    if (i == n)                                                                                    \
        return 0;
#define LIT(s)                                                                                      \
    for (const char *q = (s); *q; q++, i++) {                                                      \
        if (i == n)                                                                                \
            return 0;                                                                              \
        if (b[i] != *q)                                                                            \
            return -1;                                                                             \
    }
    WS();
    LIT("{");
    WS();
    LIT("\"name\"");
    WS();
    LIT(":");
    WS();
    if (b[i] != '"')
        return -1;
    *name = i++;
    for (bool esc = false;; i++) {
        if (i == n)
            return 0;
        if (esc)
            esc = false;
        else if (b[i] == '\\')
            esc = true;
        else if (b[i] == '"')
            break;
    }
    *n_name = ++i - *name;
    WS();
    LIT(",");
    WS();
    LIT("\"arguments\"");
    WS();
    LIT(":");
    WS();
#undef WS
#undef LIT
    return i == n - 1 ? 1 : -1;
}

/* A JSON string's text (quotes included) decoded; NULL when it is not one or on no memory. */
static char *json_text_string(const char *s, size_t n)
{
    struct json *j = NULL;
    if (json_parse(s, n, "tool call name", &j, NULL) != STATUS_OK)
        return NULL;
    char *out = json_is_string(j) ? dup0(json_string(j)) : NULL;
    json_free(j);
    return out;
}

/* Q_WHOLE at its closing tag: {"name": string, "arguments": object or JSON text} in any order. */
static bool qwen_whole(struct tool_parse *p)
{
    struct json *j = NULL;
    p->buf[p->n_buf] = 0;
    if (json_parse(p->buf, p->n_buf, "tool call", &j, NULL) != STATUS_OK) {
        bool ok = content(p, OPEN, strlen(OPEN)) && content(p, p->buf, p->n_buf) && content(p, CLOSE, strlen(CLOSE));
        enter(p, S_OUT);
        return ok;
    }
    const struct json *name = json_get(j, "name"), *args = json_get(j, "arguments");
    bool call = json_is_object(j) && json_is_string(name) && *json_string(name) &&
                (!args || json_is_object(args) || json_is_string(args));
    bool ok = true;
    if (call) {
        char *text = json_is_string(args) ? dup0(json_string(args)) : args ? json_print(args, false) : dup0("{}");
        ok = text && call_open(p, json_string(name), strlen(json_string(name)));
        if (ok) {
            struct tool_call *c = current(p);
            c->n_args = 0;
            ok = put(&c->args, &c->n_args, &c->cap_args, text, strlen(text));
            call_close(p);
        }
        free(text);
    } else {
        ok = content(p, OPEN, strlen(OPEN)) && content(p, p->buf, p->n_buf) && content(p, CLOSE, strlen(CLOSE));
        enter(p, S_OUT);
    }
    json_free(j);
    return ok;
}

static bool qwen_step(struct tool_parse *p, char c)
{
    switch (p->state) {
    case Q_BODY: {
        if (!put(&p->buf, &p->n_buf, &p->cap_buf, &c, 1))
            return false;
        size_t name = 0, n_name = 0;
        int m = p->n_buf > MAX_BODY_PREFIX ? -1 : qwen_prefix(p->buf, p->n_buf, &name, &n_name);
        if (m == 0)
            return true;
        if (m < 0 || c != '{') { /* not the streamable form: read it whole */
            p->state = Q_WHOLE;
            if (ends_with(p->buf, p->n_buf, CLOSE)) {
                p->n_buf -= strlen(CLOSE);
                return qwen_whole(p);
            }
            return true;
        }
        char *s = json_text_string(p->buf + name, n_name);
        if (!s || !*s) {
            free(s);
            p->state = Q_WHOLE;
            return true;
        }
        bool ok = call_open(p, s, strlen(s));
        free(s);
        if (!ok)
            return false;
        struct tool_call *cl = current(p);
        p->state = Q_ARGS;
        p->depth = 1, p->in_str = p->esc = false;
        return put(&cl->args, &cl->n_args, &cl->cap_args, "{", 1);
    }
    case Q_ARGS: {
        struct tool_call *cl = current(p);
        if (!p->in_str && c == '<') { /* not JSON: the object was cut short; look for the end */
            enter(p, Q_TAIL);
            if (tail_push(p, c, CLOSE))
                call_close(p);
            return true;
        }
        if (!put(&cl->args, &cl->n_args, &cl->cap_args, &c, 1))
            return false;
        if (p->in_str) {
            if (p->esc)
                p->esc = false;
            else if (c == '\\')
                p->esc = true;
            else if (c == '"')
                p->in_str = false;
        } else if (c == '"') {
            p->in_str = true;
        } else if (c == '{' || c == '[') {
            p->depth++;
        } else if ((c == '}' || c == ']') && --p->depth == 0) {
            enter(p, Q_TAIL);
        }
        return true;
    }
    case Q_TAIL:
        if (tail_push(p, c, CLOSE))
            call_close(p);
        return true;
    case Q_WHOLE:
        if (!put(&p->buf, &p->n_buf, &p->cap_buf, &c, 1))
            return false;
        if (ends_with(p->buf, p->n_buf, CLOSE)) {
            p->n_buf -= strlen(CLOSE);
            return qwen_whole(p);
        }
        return true;
    }
    return true;
}

/* ---- glm45 ---- */

bool tool_param_is_string(const struct json *schema)
{
    const struct json *type = json_get(schema, "type");
    if (json_is_string(type))
        return strcmp(json_string(type), "string") == 0;
    if (json_is_array(type)) { /* ["string", "null"]: a string, "null" included */
        bool str = false, other = false;
        for (const struct json *e = json_child(type); e; e = json_next(e)) {
            if (!json_is_string(e) || strcmp(json_string(e), "null") == 0)
                continue;
            if (strcmp(json_string(e), "string") == 0)
                str = true;
            else
                other = true;
        }
        return str && !other;
    }
    return false;
}

/* Whether call `name`'s parameter `key` is a string parameter (its value is the text as written). */
static bool glm_param_is_string(const struct tool_parse *p, const char *name, const char *key)
{
    for (const struct json *t = json_child(p->tools); t; t = json_next(t)) {
        const struct json *f = json_get(t, "function");
        if (!json_is_string(json_get(f, "name")) || strcmp(json_string(json_get(f, "name")), name) != 0)
            continue;
        return tool_param_is_string(json_get(json_get(json_get(f, "parameters"), "properties"), key));
    }
    return false;
}

static char *json_quote(const char *s)
{
    struct json *j = json_new_string(s);
    char *out = j ? json_print(j, false) : NULL;
    json_free(j);
    return out;
}

/* One argument key = value into the current call's JSON object. */
static bool glm_arg(struct tool_parse *p, const char *value, size_t n)
{
    struct tool_call *c = current(p);
    char *v = malloc(n + 1);
    if (!v)
        return false;
    memcpy(v, value, n);
    v[n] = 0;
    char *text = NULL;
    bool raw = false;
    if (!glm_param_is_string(p, c->name, p->key ? p->key : "")) {
        struct json *j = NULL;
        raw = json_parse(v, n, "argument", &j, NULL) == STATUS_OK;
        json_free(j);
    }
    /* a value that reads as JSON is passed on as written (trimmed); else it is a string */
    size_t a = 0, b = n;
    if (raw) {
        while (a < b && is_ws(v[a]))
            a++;
        while (b > a && is_ws(v[b - 1]))
            b--;
    }
    text = raw ? NULL : json_quote(v);
    char *key = json_quote(p->key ? p->key : "");
    bool ok = key && (raw || text) &&
              put(&c->args, &c->n_args, &c->cap_args, c->n_args ? ", " : "{", c->n_args ? 2 : 1) &&
              put(&c->args, &c->n_args, &c->cap_args, key, strlen(key)) && put(&c->args, &c->n_args, &c->cap_args, ": ", 2) &&
              (raw ? put(&c->args, &c->n_args, &c->cap_args, v + a, b - a) : put(&c->args, &c->n_args, &c->cap_args, text, strlen(text)));
    free(v), free(text), free(key);
    return ok;
}

/* The call's object closed ("{}" when it had no argument). */
static bool glm_end_args(struct tool_parse *p)
{
    struct tool_call *c = current(p);
    return c->n_args ? put(&c->args, &c->n_args, &c->cap_args, "}", 1) : put(&c->args, &c->n_args, &c->cap_args, "{}", 2);
}

/* Trims white space off buf[0..n) into [*a, *b). */
static void trim(const char *s, size_t n, size_t *a, size_t *b)
{
    *a = 0, *b = n;
    while (*a < *b && is_ws(s[*a]))
        (*a)++;
    while (*b > *a && is_ws(s[*b - 1]))
        (*b)--;
}

static bool glm_step(struct tool_parse *p, char c)
{
    switch (p->state) {
    case G_NAME: {
        if (!put(&p->buf, &p->n_buf, &p->cap_buf, &c, 1))
            return false;
        size_t end = p->n_buf;
        enum state next;
        if (ends_with(p->buf, p->n_buf, "<arg_key>"))
            end -= strlen("<arg_key>"), next = G_KEY;
        else if (ends_with(p->buf, p->n_buf, CLOSE))
            end -= strlen(CLOSE), next = S_OUT;
        else if (c == '\n')
            next = G_BETWEEN;
        else
            return p->n_buf <= MAX_NAME || give_back(p);
        size_t a, b;
        trim(p->buf, end, &a, &b);
        if (a == b) {
            if (next == G_BETWEEN)
                return true; /* a newline before the name */
            return next == S_OUT ? (p->n_buf -= strlen(CLOSE), give_back(p) && content(p, CLOSE, strlen(CLOSE)))
                                 : give_back(p);
        }
        for (size_t i = a; i < b; i++) /* a name is one line of text without tags */
            if ((unsigned char)p->buf[i] < 0x20 || p->buf[i] == '<' || p->buf[i] == '>') {
                if (next == S_OUT)
                    p->n_buf -= strlen(CLOSE);
                return give_back(p) && (next != S_OUT || content(p, CLOSE, strlen(CLOSE)));
            }
        if (!call_open(p, p->buf + a, b - a))
            return false;
        if (next == S_OUT) {
            bool ok = glm_end_args(p);
            call_close(p);
            return ok;
        }
        enter(p, next);
        return true;
    }
    case G_BETWEEN:
        if (tail_push(p, c, "<arg_key>")) {
            enter(p, G_KEY);
        } else if (ends_with(p->tail, p->n_tail, CLOSE)) {
            bool ok = glm_end_args(p);
            call_close(p);
            return ok;
        }
        return true;
    case G_KEY: {
        if (!put(&p->buf, &p->n_buf, &p->cap_buf, &c, 1))
            return false;
        if (!ends_with(p->buf, p->n_buf, "</arg_key>"))
            return true;
        size_t a, b;
        trim(p->buf, p->n_buf - strlen("</arg_key>"), &a, &b);
        free(p->key);
        if (!(p->key = malloc(b - a + 1)))
            return false;
        memcpy(p->key, p->buf + a, b - a);
        p->key[b - a] = 0;
        enter(p, G_AFTER_KEY);
        return true;
    }
    case G_AFTER_KEY:
        if (tail_push(p, c, "<arg_value>")) {
            enter(p, G_VALUE);
        } else if (ends_with(p->tail, p->n_tail, CLOSE)) { /* a name without a value: dropped */
            bool ok = glm_end_args(p);
            call_close(p);
            return ok;
        }
        return true;
    case G_VALUE:
        if (!put(&p->buf, &p->n_buf, &p->cap_buf, &c, 1))
            return false;
        if (!ends_with(p->buf, p->n_buf, "</arg_value>"))
            return true;
        if (!glm_arg(p, p->buf, p->n_buf - strlen("</arg_value>")))
            return false;
        enter(p, G_BETWEEN);
        return true;
    }
    return true;
}

/* ---- outside a call ---- */

static bool out_step(struct tool_parse *p, char c)
{
    const size_t open = strlen(OPEN);
    size_t ws = 0;
    while (ws < p->n_hold && is_ws(p->hold[ws]))
        ws++;
    const size_t tag = p->n_hold - ws;
    if (tag == 0 && is_ws(c)) {
        if (p->trim)
            return true;
        if (p->n_hold + 1 + open > sizeof p->hold) { /* a long run: its start cannot be kept */
            if (!content(p, p->hold, 1))
                return false;
            memmove(p->hold, p->hold + 1, --p->n_hold);
        }
        p->hold[p->n_hold++] = c;
        return true;
    }
    if (tag < open && c == OPEN[tag] && p->n_calls < TOOL_MAX_CALLS) {
        p->hold[p->n_hold++] = c;
        if (tag + 1 == open) { /* a call: the white space before it is dropped */
            p->n_hold = 0;
            p->trim = false;
            enter(p, p->fmt == TOOL_FORMAT_QWEN3 ? Q_BODY : G_NAME);
        }
        return true;
    }
    /* not a tag: what was held is content; c, once alone, may start white space or a tag */
    p->trim = false;
    if (p->n_hold) {
        bool ok = content(p, p->hold, p->n_hold);
        p->n_hold = 0;
        return ok && out_step(p, c);
    }
    return content(p, &c, 1);
}

/* The answer ended: what is held goes where it belongs. */
static bool finish(struct tool_parse *p)
{
    bool ok = true;
    switch (p->state) {
    case S_OUT: {
        size_t ws = 0;
        while (ws < p->n_hold && is_ws(p->hold[ws]))
            ws++;
        if (!(ws == p->n_hold && p->n_calls > 0)) /* white space after the last call is not content */
            ok = content(p, p->hold, p->n_hold);
        p->n_hold = 0;
        break;
    }
    case Q_BODY:
    case Q_WHOLE:
    case G_NAME: ok = give_back(p); break;
    case Q_ARGS:
    case Q_TAIL: enter(p, S_OUT); break; /* the call keeps what it had */
    default: ok = glm_end_args(p), enter(p, S_OUT); break;
    }
    return ok;
}

enum status tool_parse_feed(struct tool_parse *p, const char *text, size_t n, bool final, struct err *err)
{
    p->n_content = 0;
    bool ok = put(&p->content, &p->n_content, &p->cap_content, "", 0);
    for (size_t i = 0; i < n && ok; i++) {
        if (p->fmt == TOOL_FORMAT_NONE)
            ok = content(p, text + i, 1);
        else if (p->state == S_OUT)
            ok = out_step(p, text[i]);
        else
            ok = p->fmt == TOOL_FORMAT_QWEN3 ? qwen_step(p, text[i]) : glm_step(p, text[i]);
    }
    if (ok && final && p->fmt != TOOL_FORMAT_NONE)
        ok = finish(p);
    return ok ? STATUS_OK : err_set(err, STATUS_NOMEM, "tool calls: out of memory");
}
