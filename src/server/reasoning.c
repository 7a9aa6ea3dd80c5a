/* reasoning.c — see reasoning.h. */
#include "server/reasoning.h"

#include <stdlib.h>
#include <string.h>

void reasoning_init(struct reasoning *r, bool on)
{
    memset(r, 0, sizeof *r);
    r->on = on;
    r->state = on ? REASONING_START : REASONING_CONTENT;
}

void reasoning_free(struct reasoning *r)
{
    free(r->reason);
    free(r->content);
    memset(r, 0, sizeof *r);
}

static bool put(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return false;
        *buf = b, *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

/* One byte c into the state machine; false on no memory. The held bytes are a prefix of the tag
 * the state looks for (START: whitespace then a prefix of the opening tag; INSIDE: a prefix of the
 * closing one). */
static bool step(struct reasoning *r, char c)
{
    switch (r->state) {
    case REASONING_CONTENT: return put(&r->content, &r->n_content, &r->cap_content, &c, 1);
    case REASONING_AFTER_CLOSE:
        if (c == '\n')
            return true;
        r->state = REASONING_CONTENT;
        return put(&r->content, &r->n_content, &r->cap_content, &c, 1);
    case REASONING_START: {
        size_t ws = 0;
        while (ws < r->n_hold && (r->hold[ws] == ' ' || r->hold[ws] == '\n' || r->hold[ws] == '\t' || r->hold[ws] == '\r'))
            ws++;
        const size_t tag = r->n_hold - ws, open = sizeof REASONING_OPEN - 1;
        if (tag == 0 && (c == ' ' || c == '\n' || c == '\t' || c == '\r') && r->n_hold + 1 < sizeof r->hold) {
            r->hold[r->n_hold++] = c;
            return true;
        }
        if (tag < open && c == REASONING_OPEN[tag]) {
            r->hold[r->n_hold++] = c;
            if (tag + 1 == open) { /* the whole opening tag: reasoning begins (its whitespace dropped) */
                r->n_hold = 0;
                r->state = REASONING_INSIDE;
            }
            return true;
        }
        /* not a tag: what was held, and c, are content */
        r->state = REASONING_CONTENT;
        bool ok = put(&r->content, &r->n_content, &r->cap_content, r->hold, r->n_hold);
        r->n_hold = 0;
        return ok && put(&r->content, &r->n_content, &r->cap_content, &c, 1);
    }
    case REASONING_INSIDE: {
        const size_t close = sizeof REASONING_CLOSE - 1;
        if (c == REASONING_CLOSE[r->n_hold]) {
            r->hold[r->n_hold++] = c;
            if (r->n_hold == close) {
                r->n_hold = 0;
                r->state = REASONING_AFTER_CLOSE;
            }
            return true;
        }
        /* the held prefix was reasoning text; c may start a new tag */
        bool ok = put(&r->reason, &r->n_reason, &r->cap_reason, r->hold, r->n_hold);
        r->n_hold = 0;
        if (c == REASONING_CLOSE[0]) {
            r->hold[r->n_hold++] = c;
            return ok;
        }
        return ok && put(&r->reason, &r->n_reason, &r->cap_reason, &c, 1);
    }
    }
    return true;
}

enum status reasoning_feed(struct reasoning *r, const char *text, size_t n, bool final, struct err *err)
{
    r->n_reason = r->n_content = 0;
    if (r->reason)
        r->reason[0] = 0;
    if (r->content)
        r->content[0] = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++)
        ok = step(r, text[i]);
    if (ok && final && r->n_hold) { /* the output ended inside a possible tag: those bytes were text */
        ok = r->state == REASONING_INSIDE ? put(&r->reason, &r->n_reason, &r->cap_reason, r->hold, r->n_hold)
                                          : put(&r->content, &r->n_content, &r->cap_content, r->hold, r->n_hold);
        r->n_hold = 0;
    }
    if (ok && (!r->reason || !r->content)) /* both strings exist after a feed, possibly empty */
        ok = put(&r->reason, &r->n_reason, &r->cap_reason, "", 0) && put(&r->content, &r->n_content, &r->cap_content, "", 0);
    return ok ? STATUS_OK : err_set(err, STATUS_NOMEM, "reasoning: out of memory");
}
