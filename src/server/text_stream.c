/* text_stream.c — see text_stream.h. */
#include "server/text_stream.h"

#include <stdlib.h>
#include <string.h>

void text_stream_init(struct text_stream *ts, const struct tokenizer *tok, char *const *stop, int n_stop)
{
    memset(ts, 0, sizeof *ts);
    detok_stream_init(&ts->ds, tok, true);
    ts->stop = stop;
    ts->n_stop = n_stop;
    for (int i = 0; i < n_stop; i++) {
        size_t n = strlen(stop[i]);
        if (n > 0 && n - 1 > ts->hold)
            ts->hold = n - 1;
    }
}

void text_stream_free(struct text_stream *ts)
{
    detok_stream_free(&ts->ds);
    free(ts->text);
    memset(ts, 0, sizeof *ts);
}

static enum status append(struct text_stream *ts, const char *s, size_t n, struct err *err)
{
    if (ts->len + n + 1 > ts->cap) {
        size_t cap = ts->cap ? ts->cap : 256;
        while (cap < ts->len + n + 1)
            cap *= 2;
        char *t = realloc(ts->text, cap);
        if (!t)
            return err_set(err, STATUS_NOMEM, "text stream: out of memory for %zu bytes", cap);
        ts->text = t;
        ts->cap = cap;
    }
    memcpy(ts->text + ts->len, s, n);
    ts->len += n;
    ts->text[ts->len] = 0;
    return STATUS_OK;
}

/* Looks for stop strings in the text that the last `added` bytes could complete. */
static void find_stop(struct text_stream *ts, size_t added)
{
    size_t from = ts->len - added;
    from = from > ts->hold ? from - ts->hold : 0;
    size_t best = ts->len + 1;
    for (int i = 0; i < ts->n_stop; i++) {
        size_t n = strlen(ts->stop[i]);
        const char *hit = n ? memmem(ts->text + from, ts->len - from, ts->stop[i], n) : NULL;
        if (hit && (size_t)(hit - ts->text) < best)
            best = (size_t)(hit - ts->text);
    }
    if (best <= ts->len) {
        ts->len = best;
        ts->text[best] = 0;
        ts->stopped = true;
    }
}

enum status text_stream_push(struct text_stream *ts, int32_t token, struct err *err)
{
    if (ts->stopped)
        return STATUS_OK;
    /* a piece longer than buf stays in the detokenizer and comes out with
     * the next push or the final flush: late, never lost */
    char buf[4096];
    size_t n = 0;
    if (!tokenizer_id_known(ts->ds.tok, token))
        return STATUS_OK; /* a row of the model's padded vocabulary: no text, as HF's decode skips it */
    enum status st = detok_stream_push(&ts->ds, token, buf, sizeof buf, &n, err);
    if (!st && n > 0 && !(st = append(ts, buf, n, err)))
        find_stop(ts, n);
    return st;
}

enum status text_stream_finish(struct text_stream *ts, struct err *err)
{
    ts->finished = true;
    char buf[256];
    size_t n = 0;
    while (!ts->stopped) {
        enum status st = detok_stream_flush(&ts->ds, buf, sizeof buf, &n, err);
        if (st)
            return st;
        if (n == 0)
            break;
        if ((st = append(ts, buf, n, err)))
            return st;
        find_stop(ts, n);
    }
    return STATUS_OK;
}

size_t text_stream_take(struct text_stream *ts, const char **out)
{
    size_t upto = ts->len;
    if (!ts->stopped && !ts->finished) {
        upto = ts->len > ts->hold ? ts->len - ts->hold : 0;
        /* never split a UTF-8 character */
        while (upto > ts->taken && upto < ts->len && ((unsigned char)ts->text[upto] & 0xC0) == 0x80)
            upto--;
    }
    if (upto <= ts->taken) {
        *out = ts->text ? ts->text + ts->taken : "";
        return 0;
    }
    *out = ts->text + ts->taken;
    size_t n = upto - ts->taken;
    ts->taken = upto;
    return n;
}
