/* text_stream.h — generated tokens to the text a client may see, with stop strings.
 *
 * Tokens are detokenized incrementally (whole UTF-8 characters only); the
 * text is searched for the request's stop strings, and ends just before the
 * first one found (the stop string itself is not returned, as in OpenAI's
 * API). While generation goes on, the last (longest stop - 1) bytes are held
 * back, since they could be the start of a stop string; held-back text never
 * splits a UTF-8 character. One per request; not thread-safe.
 *
 * defines: struct text_stream, text_stream_init(), text_stream_free(), text_stream_push(),
 *          text_stream_finish(), text_stream_take()
 */
#ifndef MOESERVE_SERVER_TEXT_STREAM_H
#define MOESERVE_SERVER_TEXT_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "format/tokenizer.h"

struct text_stream {
    struct detok_stream ds;
    char *const *stop;   /* (n_stop) borrowed */
    int n_stop;
    size_t hold;         /* longest stop string - 1 */
    char *text;          /* (cap) all text so far, owned */
    size_t len, cap;
    size_t taken;        /* bytes handed out by text_stream_take */
    bool stopped;        /* a stop string was found: text ends before it */
    bool finished;       /* text_stream_finish was called */
};

void text_stream_init(struct text_stream *ts, const struct tokenizer *tok, char *const *stop, int n_stop);
/* Safe on a zeroed struct. */
void text_stream_free(struct text_stream *ts);
/* Adds one token's text; sets ts->stopped when a stop string appears. Tokens
 * after a stop are ignored, and so are ids the tokenizer has no token for (a model's vocabulary
 * is often padded past its tokenizer's: Qwen3 151936 rows, 151669 tokens). */
enum status text_stream_push(struct text_stream *ts, int32_t token, struct err *err);
/* No more tokens: the detokenizer's held-back bytes join the text. */
enum status text_stream_finish(struct text_stream *ts, struct err *err);
/* The text that became final since the last call: *out points into the
 * stream (valid until the next push), returns its length. */
size_t text_stream_take(struct text_stream *ts, const char **out);

#endif
