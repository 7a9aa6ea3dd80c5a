/* server.h — the OpenAI-compatible HTTP server (libmicrohttpd).
 *
 * Routes: POST /v1/completions, POST /v1/chat/completions (whole JSON or
 * server-sent events ending in "data: [DONE]"), GET /v1/models and /v1/models/{id},
 * POST /tokenize and /detokenize, GET /health, /version, /metrics (Prometheus text);
 * HEAD wherever GET is, OPTIONS everywhere (Allow; CORS preflights for the origins of
 * allowed_origins, whose answers then carry Access-Control-Allow-Origin). Every error is an
 * OpenAI error body with the matching status. With an API key, /v1/ routes, /tokenize and
 * /detokenize need "Authorization: Bearer KEY"; /health, /version and /metrics stay open.
 *
 * Threads: libmicrohttpd runs one thread per connection; a generation's
 * thread parses, tokenizes and submits to the scheduler, then waits on the
 * request's condition variable and writes tokens as they come. It polls its
 * socket while waiting, so a client that goes away cancels its request at
 * once (the scheduler frees the KV blocks in its next step), streamed or not.
 * Bodies over max_body_bytes are refused with 413.
 *
 * defines: struct server_opts, struct server_model, struct server, server_start(),
 *          server_port(), server_drain(), server_stop()
 */
#ifndef MOESERVE_SERVER_SERVER_H
#define MOESERVE_SERVER_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/scheduler.h"
#include "server/metrics.h"
#include "server/prompt_build.h"
#include "server/tool_parse.h"

struct server_opts {
    const char *host;          /* numeric address or name to bind; default "127.0.0.1" */
    int port;                  /* 0: any free port (server_port() tells which) */
    const char *api_key;       /* NULL: no authentication */
    const char *model_name;    /* the id clients send and /v1/models lists */
    size_t max_body_bytes;     /* default 4 MiB */
    double request_timeout;    /* seconds from arrival to the end of generation; 0 = none */
    int max_connections;       /* open connections answered; past it 503 (default 1024) */
    int max_per_client;        /* open connections of one client address; past it 503 (0: max_connections) */
    int idle_timeout;          /* seconds a connection may stay silent before it is closed (default 600) */
    bool lenient;              /* unsupported request fields ignored with a warning, not refused */
    bool reasoning;            /* chat answers carry the model's <think> part as reasoning_content (server/reasoning.h) */
    enum tool_format tool_format; /* how the model writes tool calls (server/tool_parse.h); NONE: tools refused */
    const char *allowed_origins; /* CORS: "*" or "https://a,https://b" may read answers; NULL/"": none */
    /* the model's sampling defaults (generation_config.json) for requests that leave them out */
    bool has_temperature, has_top_p, has_top_k;
    double temperature, top_p;
    int top_k;
};

struct server_model {
    struct scheduler *sch;     /* borrowed, running */
    struct prompt_model pm;    /* borrowed pieces */
    int max_context;
};

struct MHD_Daemon;

/* One client address and its open connections (an open-addressing table of SERVER_CLIENT_SLOTS). */
#define SERVER_CLIENT_SLOTS 4096
struct server_client {
    unsigned char addr[16]; /* IPv4 in the first 4 bytes (len 4), else IPv6 */
    int len;                /* 4 or 16; 0: never used; -1: freed */
    int n_open;
};

struct server {
    struct server_opts o;      /* strings borrowed */
    struct server_model m;
    struct metrics metrics;
    struct MHD_Daemon *daemon;
    atomic_bool draining;      /* server_drain(): new generations get 503, running ones go on */
    atomic_bool stopping;
    atomic_bool failed;        /* server_fail(): the model cannot run any more (a rank died) */
    char fail_msg[256];        /* why; written once before failed is set */
    atomic_int n_live;         /* generations whose connection is still being answered */
    pthread_mutex_t conn_mu;   /* guards n_open and clients */
    int n_open;                /* connections open now */
    struct server_client *clients; /* (SERVER_CLIENT_SLOTS) open connections per client address, owned */
    struct token_vocab *grammar_vocab; /* bytes per id for structured output (api_format.h), owned; NULL: off */
    atomic_ullong n_ids;       /* request ids and default seeds */
    uint64_t salt;             /* makes ids differ between runs */
    long created;              /* unix time at start */
    int port;
};

enum status server_start(struct server *srv, const struct server_opts *o, const struct server_model *m,
                         struct err *err);
int server_port(const struct server *srv);
/* A graceful end: new generations are refused with 503 at once, running and queued ones may
 * finish for up to grace seconds; then the scheduler cancels the rest, whose streams end with
 * a "shutting_down" error event and [DONE] (non-streamed: a 503 body), and the answers are
 * given up to 2 s to go out. Call before server_stop(). */
void server_drain(struct server *srv, double grace);
/* The model cannot run any more (one of its ranks died: the scheduler may be stuck in a
 * collective for good): from now on every generation, new or running, ends with a 503
 * "rank_failed" error naming msg (streams: an error event and [DONE]) and /health answers 503.
 * The caller then exits; nothing here waits for the scheduler. */
void server_fail(struct server *srv, const char *msg);
/* Ends open connections (streams end with an error), joins every thread.
 * Safe on a zeroed struct. */
void server_stop(struct server *srv);

#endif
