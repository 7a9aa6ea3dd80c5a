/* server_internal.h — what server.c (routing, replies), server_generate.c (completions) and
 * server_tokenize.c share. Not an API: only src/server includes it.
 *
 * defines: struct conn_ctx, server_reply(), server_reply_error(), server_client_gone(),
 *          server_body_bounded(), server_generate(), server_tokenize(), server_detokenize(),
 *          server_chat_page()
 */
#ifndef MOESERVE_SERVER_SERVER_INTERNAL_H
#define MOESERVE_SERVER_SERVER_INTERNAL_H

#include <stdbool.h>
#include <microhttpd.h>

#include "server/api_request.h"
#include "server/server.h"

/* One HTTP request (libmicrohttpd's per-request pointer). */
struct conn_ctx {
    struct server *srv;
    struct MHD_Connection *conn;
    enum metrics_endpoint ep;
    char *body;                /* (cap) the request body so far, NUL-terminated, owned */
    size_t len, cap;
    bool too_big;              /* over max_body_bytes: the rest is read and dropped */
    bool refused;              /* answered from the headers (no key, too big, too many connections): no
                                  body is kept */
};

/* Queues a response with body (owned, may be NULL for empty) and counts it. */
enum MHD_Result server_reply(struct conn_ctx *cc, int status, const char *content_type, char *body);
/* The chat page (chat_page.c), a static string. */
const char *server_chat_page(void);
enum MHD_Result server_reply_error(struct conn_ctx *cc, const struct api_error *e);
/* True when the peer closed or reset the connection. */
bool server_client_gone(struct MHD_Connection *conn);
/* False (e: 400) when cc's body holds more JSON values than a request to this model can use. */
bool server_body_bounded(const struct conn_ctx *cc, struct api_error *e);
/* POST /v1/completions and /v1/chat/completions with the whole body in cc. */
enum MHD_Result server_generate(struct conn_ctx *cc, enum api_kind kind);
/* server_tokenize.c: POST /tokenize and /detokenize with the whole body in cc. */
enum MHD_Result server_tokenize(struct conn_ctx *cc);
enum MHD_Result server_detokenize(struct conn_ctx *cc);

#endif
