/* reasoning.h — a thinking model's answer split into its reasoning and its content.
 *
 * Qwen3 and GLM-4.5/GLM-5 chat templates let the model think first: it writes "<think>", its
 * reasoning, "</think>", then the answer. Clients (OpenAI SDKs with vLLM's extension) expect the
 * reasoning apart, as message.reasoning_content (delta.reasoning_content when streaming), and the
 * answer alone in content. Text is fed as it becomes final; a tag split across feeds is held back
 * until it is known, so no byte of a tag reaches either side and no other byte is lost or
 * duplicated. The opening tag counts only at the start (after whitespace); output that does not
 * start with it is all content. Newlines right after "</think>" are dropped (the templates put
 * them there). Not thread-safe; one per request.
 *
 * defines: struct reasoning, reasoning_init(), reasoning_feed(), reasoning_free(), REASONING_OPEN,
 *          REASONING_CLOSE
 */
#ifndef MOESERVE_SERVER_REASONING_H
#define MOESERVE_SERVER_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

#define REASONING_OPEN "<think>"
#define REASONING_CLOSE "</think>"

enum reasoning_state { REASONING_START, REASONING_INSIDE, REASONING_AFTER_CLOSE, REASONING_CONTENT };

struct reasoning {
    bool on;                    /* off: every byte is content */
    enum reasoning_state state;
    char hold[16];              /* bytes that may be the start of a tag (or leading whitespace) */
    size_t n_hold;
    char *reason, *content;     /* what the last feed made final, owned (NUL-terminated) */
    size_t n_reason, n_content, cap_reason, cap_content;
};

void reasoning_init(struct reasoning *r, bool on);
/* Feeds text[0..n) (final: the end of the output: everything held comes out); fills r->reason /
 * r->content with this feed's final bytes. */
enum status reasoning_feed(struct reasoning *r, const char *text, size_t n, bool final, struct err *err);
/* Safe on a zeroed struct. */
void reasoning_free(struct reasoning *r);

#endif
