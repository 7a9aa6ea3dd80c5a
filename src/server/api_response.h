/* api_response.h — OpenAI-shaped JSON bodies: errors, the model list,
 * completions and chat completions, whole or as stream chunks.
 *
 * Shapes follow the OpenAI API reference: "text_completion" /
 * "chat.completion" / "chat.completion.chunk" objects with one choice (index
 * 0), usage {prompt_tokens, completion_tokens, total_tokens}, and
 * log-probabilities in each API's own layout (completions: parallel lists
 * tokens / token_logprobs / top_logprobs / text_offset; chat: content: a list
 * of {token, logprob, bytes, top_logprobs}). Every function returns a
 * malloc'ed NUL-terminated string, or NULL when out of memory.
 *
 * defines: struct api_logprobs, struct api_prompt_logprobs, struct api_tool_call, struct api_result, api_scrub_paths(), api_error_json(), api_models_json(), api_model_json(),
 *          api_result_json(), api_usage_chunk_json()
 */
#ifndef MOESERVE_SERVER_API_RESPONSE_H
#define MOESERVE_SERVER_API_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/tokenizer.h"
#include "server/api_request.h"

/* Replaces every absolute path in msg (a '/' after a space, quote or parenthesis, with a second
 * '/' before the next space, ':', quote, ',' or ')') by its last component, in place. */
void api_scrub_paths(char *msg);
/* Log-probabilities of n consecutive generated tokens. */
struct api_logprobs {
    int n;
    const int32_t *ids;     /* (n) */
    const float *lp;        /* (n) */
    int k;                  /* alternatives per token */
    const int32_t *top_ids; /* (n, k) */
    const float *top_lp;    /* (n, k) */
    size_t text_offset;     /* completions: offset of the first token's text in the whole output */
    const struct tokenizer *tok; /* renders token strings */
};

/* vLLM's prompt_logprobs of one prompt: at each position after the first, the prompt token's log p
 * and rank and the k likeliest (rank j + 1), as [null, {"ID": {logprob, rank, decoded_token}}, ...]. */
struct api_prompt_logprobs {
    int n;                  /* prompt tokens */
    const int32_t *ids;     /* (n) */
    const float *lp;        /* (n) [0] unused */
    const int32_t *rank;    /* (n) */
    int k, stride;          /* alternatives shown a position; the arrays' count a position (>= k) */
    const int32_t *top_ids; /* (n, stride) */
    const float *top_lp;    /* (n, stride) */
    const struct tokenizer *tok;
};

/* One tool call as a chat answer carries it: whole (message.tool_calls) or a stream delta's piece
 * (delta.tool_calls: id, type and name in a call's first delta, then pieces of the arguments). */
struct api_tool_call {
    int index;                  /* the call's place in the answer */
    const char *id;             /* "call_..."; NULL: a later delta of the call (no id, type, name) */
    const char *name;
    const char *args;           /* the arguments' JSON text, or this delta's piece of it */
    size_t n_args;
};

struct api_result {
    enum api_kind kind;
    int index;                  /* the choice's index (n, several prompts); 0 for one */
    const char *id;             /* "cmpl-..." / "chatcmpl-..." */
    const char *model;
    long created;               /* unix seconds */
    const char *text;           /* the whole text, or a chunk's delta */
    size_t text_len;
    const char *finish_reason;  /* "stop", "length", or NULL (a chunk before the end) */
    bool role;                  /* chat chunk: carries delta.role = "assistant" */
    bool reasoning_on;          /* chat: the model thinks (server/reasoning.h): reasoning_content is present */
    const char *reasoning;      /* its reasoning, the whole or a chunk's delta */
    size_t reasoning_len;
    bool has_usage;
    int prompt_tokens, completion_tokens, cached_tokens;
    const struct api_logprobs *logprobs; /* NULL: "logprobs": null */
    const struct api_prompt_logprobs *prompt_logprobs; /* choices[].prompt_logprobs (completions) or the
                                                          response's (chat, vLLM's place), or NULL (absent) */
    const struct api_tool_call *tool_calls; /* (n_tool_calls) chat: the calls, or this chunk's deltas of them */
    int n_tool_calls;
};

/* The Responses API's view of one generation: its response object (the non-streamed body, and
 * inside the stream's response.created / response.completed events) and its output items. */
struct api_responses_view {
    const char *id, *model;
    long created;
    const char *status;            /* "in_progress", "completed", "incomplete" */
    const char *incomplete_reason; /* "max_output_tokens", or NULL */
    const char *msg_id, *rs_id;    /* the message item's and the reasoning item's ids */
    const char *text;              /* the whole answer so far */
    size_t text_len;
    const char *reasoning;         /* the whole reasoning, when reasoning_len > 0 */
    size_t reasoning_len;
    bool output;                   /* false: "output": [] (the response as it starts) */
    int input_tokens, output_tokens, cached_tokens;
    double temperature, top_p;
    int max_output_tokens;         /* 0: null */
    const struct api_tool_call *calls; /* (n_calls) function_call items after the message (which is left
                                          out when there is no text) */
    int n_calls;
    const struct json *tools;      /* the request's tools in chat's form (borrowed), or NULL */
    enum api_tool_choice tool_choice;
    const char *tool_name;         /* API_TOOL_NAMED: the function */
};
struct json *api_responses_object(const struct api_responses_view *v);
char *api_responses_json(const struct api_responses_view *v);
/* {"type": "message", "id", "status", "role": "assistant", "content": [output_text]} (text NULL: []) */
struct json *api_responses_message_item(const char *id, const char *status, const char *text, size_t n);
/* {"type": "function_call", "id": "fc_...", "call_id", "name", "arguments", "status"} (args: c's, or "" when
 * !with_args) */
struct json *api_responses_call_item(const struct api_tool_call *c, const char *status, bool with_args);
/* {"type": "reasoning", "id", "summary": [], "content": [reasoning_text]} (text NULL: []) */
struct json *api_responses_reasoning_item(const char *id, const char *status, const char *text, size_t n);
/* "event: TYPE\ndata: {"type": TYPE, "sequence_number": seq, ...fields' members}\n\n" (fields is
 * consumed; may be NULL). */
char *api_responses_event(const char *type, int seq, struct json *fields);

char *api_error_json(const struct api_error *e);
char *api_models_json(const char *model, long created, int max_context);
/* GET /v1/models/{id}: the one model object of that list. */
char *api_model_json(const char *model, long created, int max_context);
/* chunk: a streaming chunk (delta for chat) instead of the whole response. */
char *api_result_json(const struct api_result *r, bool chunk);
/* One answer of several choices (n, or several prompts): r[0..k) in index order, their usage
 * summed into `usage` (its prompt and completion counts). */
char *api_results_json(const struct api_result *r, int k, const struct api_result *usage);
/* The last chunk of a stream with include_usage: no choices, only usage. */
char *api_usage_chunk_json(const struct api_result *r);

#endif
