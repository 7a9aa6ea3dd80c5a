/* tool_parse.h — the tool calls a model writes, cut out of its answer.
 *
 * A chat model given tools answers either with text or with calls written in its family's format:
 *   qwen3: <tool_call>\n{"name": "f", "arguments": {"k": "v"}}\n</tool_call>
 *   glm45: <tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>
 *          (GLM-4.5; GLM-4.7/5 write the same without the newlines)
 * Clients (OpenAI's API) want them as tool_calls: a name and the arguments as JSON text, and the
 * rest of the answer as content. The answer is fed as it becomes final (after the reasoning is
 * split off); a tag split across feeds is held back until it is known. What was cut is the same
 * however the text is split into feeds: a stream's deltas add up to the whole answer's calls.
 *
 * qwen3: the arguments are the model's own JSON object text, passed on as written byte for byte
 * (streamed as it comes once the name is known); a call whose body is not {"name", "arguments"}
 * in that order is held until its closing tag and parsed whole; one that does not parse is
 * content, tags included. glm45: a value is the text the template printed, which is the value
 * itself for a string and its JSON for anything else; so it is read back as JSON where the
 * function's parameter schema does not say "string" and the text parses as JSON, else as a
 * string, and the arguments object is written as Python's json.dumps writes it ({"k": "v", ...}).
 * White space between calls and right before a call is dropped; text around them is content.
 * Output that ends inside a call keeps the call with what it had (its arguments may be cut); one
 * that ends before the name is known gives its text back as content.
 *
 * Not thread-safe; one per choice.
 *
 * defines: enum tool_format, struct tool_call, struct tool_parse, tool_parse_init(),
 *          tool_parse_feed(), tool_parse_free(), tool_format_from_name(), tool_format_name(),
 *          tool_param_is_string(), TOOL_MAX_CALLS
 */
#ifndef MOESERVE_SERVER_TOOL_PARSE_H
#define MOESERVE_SERVER_TOOL_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/json.h"
#include "base/status.h"

#define TOOL_MAX_CALLS 64 /* calls in one answer; past it "<tool_call>" is plain text */

enum tool_format { TOOL_FORMAT_NONE, TOOL_FORMAT_QWEN3, TOOL_FORMAT_GLM45 };

struct tool_call {
    char *name;            /* owned; the call exists once its name is known */
    char *args;            /* owned, NUL-terminated: the arguments' JSON text so far */
    size_t n_args, cap_args;
    bool done;             /* its closing tag came: args is whole */
};

struct tool_parse {
    enum tool_format fmt;       /* NONE: every byte is content */
    const struct json *tools;   /* borrowed: the request's tools (glm45 reads parameter types) */
    int state;                  /* tool_parse.c's enum */
    char hold[24];              /* outside a call: white space, then a prefix of "<tool_call>" */
    size_t n_hold;
    bool trim;                  /* white space right after a call is dropped */
    char *buf;                  /* (cap_buf) inside a call: the piece being read (body, name, key, value) */
    size_t n_buf, cap_buf;
    char tail[16];              /* the last bytes of a part whose text is skipped (up to a tag) */
    size_t n_tail;
    char *key;                  /* glm45: the argument whose value comes next, owned */
    int depth;                  /* qwen3 streamed arguments: JSON nesting, and string state */
    bool in_str, esc;
    struct tool_call calls[TOOL_MAX_CALLS];
    int n_calls;
    char *content;              /* this feed's content, owned (NUL-terminated) */
    size_t n_content, cap_content;
};

/* tools: the request's tools array (borrowed for the parser's life), or NULL. */
void tool_parse_init(struct tool_parse *p, enum tool_format fmt, const struct json *tools);
/* Feeds text[0..n) (final: the answer ended: nothing stays held). Fills p->content with this
 * feed's content; calls grow in p->calls (a name appears once, args only grow). */
enum status tool_parse_feed(struct tool_parse *p, const char *text, size_t n, bool final, struct err *err);
/* Safe on a zeroed struct. */
void tool_parse_free(struct tool_parse *p);
/* "qwen3", "glm45", "none" -> the format; false for another name. */
bool tool_format_from_name(const char *name, enum tool_format *out);
const char *tool_format_name(enum tool_format f);
/* glm45: whether a parameter of this schema (a property of the function's parameters; NULL: not
 * listed) is read as the text written, never as JSON: its "type" is "string", or a list of
 * "string" and "null". tool_grammar writes such values as raw text, the others as JSON. */
bool tool_param_is_string(const struct json *schema);

#endif
