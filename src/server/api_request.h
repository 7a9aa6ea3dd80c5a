/* api_request.h — an OpenAI completions / chat completions request body,
 * parsed and checked.
 *
 * Every field this server understands is type- and range-checked; a bad one
 * yields an OpenAI-shaped error (HTTP status, type, param, message naming the
 * field). Fields it does not know are ignored, as OpenAI clients send extras; fields it knows
 * and does not implement are refused (api_request_parse()). A body with
 * bytes after its JSON value, a key twice in one object or a \u0000 in a string is refused:
 * a proxy in front might read it differently, or the C string would end early.
 * JSON null counts as absent. Checks that need the model (token ids in range,
 * prompt + max_tokens within the context, the model name) are the server's.
 * Pure: no I/O and no global state, so it is fuzzed (tests/fuzz/fuzz_request.c).
 *
 * defines: enum api_kind, struct api_error, api_error_set(), struct api_message,
 *          struct api_request, api_request_parse(), api_request_free(), API_MAX_STOP
 */
#ifndef MOESERVE_SERVER_API_REQUEST_H
#define MOESERVE_SERVER_API_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

struct grammar;

#define API_MAX_STOP 4 /* OpenAI's limit on stop sequences */
#define API_MAX_BIAS 300     /* logit_bias entries (OpenAI's limit; = SAMPLER_MAX_BIAS) */
#define API_MAX_STOP_IDS 64  /* stop_token_ids (= SCHED_MAX_STOP_IDS) */
#define API_MAX_TEMPLATE_BYTES 65536 /* a request's chat_template */
#define API_MAX_CHOICES 16   /* n */
#define API_MAX_PROMPTS 64   /* completions: prompts in one request */

/* One more prompt of a completions request (the first is api_request's own): text or ids. */
struct api_prompt {
    char *text;     /* owned, or NULL */
    int32_t *ids;   /* (n_ids) owned, or NULL */
    int n_ids;
};
#define API_COMPLETIONS_DEFAULT_MAX_TOKENS 16 /* OpenAI's default for /v1/completions */

/* API_RESPONSES: OpenAI's /v1/responses, parsed into messages (instructions, input) and rendered
 * through the chat template like API_CHAT. */
enum api_kind { API_COMPLETIONS, API_CHAT, API_RESPONSES };

/* What the client is told: {"error": {"message", "type", "param", "code"}}. */
struct api_error {
    int http_status;   /* 400, 401, 404, 405, 408, 413, 500, 503 */
    char type[32];     /* "invalid_request_error", "server_error", ... */
    char param[48];    /* the offending field, "" for none */
    char code[48];     /* "context_length_exceeded", ... or "" */
    char message[512];
};

/* Fills e; returns STATUS_INVALID so parsers can `return api_error_set(...)`. */
enum status api_error_set(struct api_error *e, int http_status, const char *type, const char *param,
                          const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

struct api_message {
    char *role;    /* owned */
    char *content; /* owned; text parts joined, "" for null content */
    char *extra;   /* owned JSON text of an object, or NULL: what the template gets beside role and content
                      (tool_calls with their arguments as objects, tool_call_id, name, reasoning_content) */
};

#define API_MAX_TOOLS 128 /* OpenAI's limit */
#define API_MAX_TOOL_NAME 64 /* OpenAI's: a-z, A-Z, 0-9, _ and -, at most 64 */

/* tool_choice: AUTO (the default with tools: the model may call), NONE (it may not: the tools are
 * not rendered and nothing is parsed), REQUIRED (at least one call), NAMED (that function). */
enum api_tool_choice { API_TOOL_AUTO, API_TOOL_NONE, API_TOOL_REQUIRED, API_TOOL_NAMED };

struct api_request {
    enum api_kind kind;
    char *model;                 /* owned */
    /* completions: exactly one of prompt_text and prompt_ids */
    char *prompt_text;           /* owned */
    int32_t *prompt_ids;         /* (n_prompt_ids) owned; ids unchecked against the vocabulary */
    int n_prompt_ids;
    struct api_prompt *more;     /* (n_more) the prompts after the first, owned */
    int n_more;
    int n;                       /* choices a prompt (1..API_MAX_CHOICES) */
    /* chat */
    struct api_message *messages; /* (n_messages) owned */
    int n_messages;

    int max_tokens;              /* completions: 16 when not given (OpenAI's default); chat: 0 = not given
                                    (the rest of the context) */
    double temperature;          /* default 1 */
    double top_p;                /* default 1 */
    int top_k;                   /* 0 = off (-1 is accepted as off) */
    bool has_temperature, has_top_p, has_top_k; /* given: the model's defaults do not apply */
    bool has_seed;
    uint64_t seed;
    char *stop[API_MAX_STOP];    /* owned, non-empty strings */
    int n_stop;
    bool stream;
    bool include_usage;          /* stream_options.include_usage */
    bool logprobs;               /* return log-probabilities */
    int top_logprobs;            /* alternatives per token: completions' logprobs N, chat's top_logprobs */
    bool ignore_eos;             /* extension (vLLM's): generate max_tokens whatever is sampled */
    bool echo;                   /* completions: the prompt before the text (with logprobs: its tokens' too) */
    bool max_tokens_zero;        /* completions with echo: max_tokens 0, only the prompt scored */
    bool prompt_logprobs;        /* completions: vLLM's prompt_logprobs given (each prompt token's log p and rank) */
    int prompt_top;              /* with it: the likeliest at each prompt position, 0..20 */
    double frequency_penalty;    /* [-2, 2], 0 = off (over the generated tokens) */
    double presence_penalty;     /* [-2, 2], 0 = off */
    double repetition_penalty;   /* (0, 10], 1 = off (vLLM's: prompt and generated tokens) */
    double min_p;                /* [0, 1], 0 = off */
    int min_tokens;              /* vLLM's: end-of-sequence and stop_token_ids masked before this many */
    int n_bias;
    int32_t bias_ids[API_MAX_BIAS]; /* logit_bias: token ids (checked against the vocabulary at submit) */
    float bias[API_MAX_BIAS];       /* [-100, 100] */
    int n_stop_ids;
    int32_t stop_ids[API_MAX_STOP_IDS]; /* vLLM's stop_token_ids */
    char *template_kwargs;       /* chat: chat_template_kwargs as JSON text (an object), owned, or NULL */
    char *chat_template;         /* chat: a Jinja template of the request's own (vLLM's), owned, or NULL */
    char *tools;                 /* chat: the tools as JSON text (a checked, non-empty array), owned, or NULL */
    enum api_tool_choice tool_choice;
    char tool_name[API_MAX_TOOL_NAME + 1]; /* NAMED: the function */
    bool single_call;            /* parallel_tool_calls false: at most one call is answered (the first) */
    struct grammar *grammar;     /* response_format / text.format json_object or json_schema, compiled
                                    (server/api_format.h): a reference, owned; NULL: free text */
    char ignored[256];           /* lenient parse: the unsupported fields that asked for something, "a, b" */
};

/* Parses body[0..len). On failure returns STATUS_INVALID with e filled
 * (status 400) and *rq zeroed. A field OpenAI (or vLLM) defines that this server does not
 * implement (suffix, best_of, functions, ...) is refused with 400 naming
 * it when its value asks for something (anything but its no-op: null, false, 0, "", [], {},
 * best_of 1, function_call "none"), so that no answer silently
 * ignores it. tool_choice "required" and named are kept: the server compiles their grammar
 * (server/tool_grammar.h), which needs the model's call format. */
enum status api_request_parse(struct api_request *rq, enum api_kind kind, const char *body, size_t len,
                              struct api_error *e);
/* The same; lenient: those fields are listed in rq->ignored instead of refused (serve --lenient). */
enum status api_request_parse_opts(struct api_request *rq, enum api_kind kind, const char *body, size_t len,
                                   bool lenient, struct api_error *e);
/* Safe on a zeroed struct. */
void api_request_free(struct api_request *rq);
/* dst = a deep copy of src asking one choice (n = 1) for its prompt `prompt` (0: the first, i: more[i - 1]). */
enum status api_request_copy_one(const struct api_request *src, int prompt, struct api_request *dst, struct api_error *e);

#endif
