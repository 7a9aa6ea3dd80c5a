/* server.c — see server.h. The daemon, routing, bodies, authentication and
 * the small routes; generation lives in server_generate.c.
 *
 * libmicrohttpd calls on_request several times per HTTP request: once with
 * the headers, once per piece of body, once more when the body is complete;
 * only the last call answers (except a Content-Length far over the limit,
 * refused at once without reading the body).
 */
#include "server/server_internal.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/timer.h"
#include "base/version.h"
#include "server/api_format.h"
#include "server/api_response.h"

enum { REFUSE_UNREAD_FACTOR = 16 }; /* bodies declared over 16x the limit are not even read */

static enum metrics_endpoint endpoint_of(const char *url)
{
    if (strcmp(url, "/v1/completions") == 0)
        return METRICS_EP_COMPLETIONS;
    if (strcmp(url, "/v1/chat/completions") == 0)
        return METRICS_EP_CHAT;
    if (strcmp(url, "/v1/models") == 0)
        return METRICS_EP_MODELS;
    if (strcmp(url, "/health") == 0)
        return METRICS_EP_HEALTH;
    if (strcmp(url, "/metrics") == 0)
        return METRICS_EP_METRICS;
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11])
        return METRICS_EP_MODEL;
    if (strcmp(url, "/tokenize") == 0)
        return METRICS_EP_TOKENIZE;
    if (strcmp(url, "/detokenize") == 0)
        return METRICS_EP_DETOKENIZE;
    if (strcmp(url, "/version") == 0)
        return METRICS_EP_VERSION;
    if (strcmp(url, "/") == 0)
        return METRICS_EP_PAGE;
    if (strcmp(url, "/v1/responses") == 0)
        return METRICS_EP_RESPONSES;
    return METRICS_EP_OTHER;
}

static bool ep_takes_post(enum metrics_endpoint ep)
{
    return ep == METRICS_EP_COMPLETIONS || ep == METRICS_EP_CHAT || ep == METRICS_EP_TOKENIZE ||
           ep == METRICS_EP_DETOKENIZE || ep == METRICS_EP_RESPONSES;
}

/* Routes behind the API key: the model's (/v1/...) and the tokenizer's; /health, /metrics and
 * /version stay open for probes. */
static bool needs_key(enum metrics_endpoint ep, const char *url)
{
    return strncmp(url, "/v1/", 4) == 0 || ep == METRICS_EP_TOKENIZE || ep == METRICS_EP_DETOKENIZE;
}

/* The request's Origin when --allowed-origins lets it read the answer ("*": any), else NULL. */
static const char *cors_origin(const struct conn_ctx *cc)
{
    const char *list = cc->srv->o.allowed_origins;
    if (!list || !*list)
        return NULL;
    const char *origin = MHD_lookup_connection_value(cc->conn, MHD_HEADER_KIND, "Origin");
    if (!origin)
        return NULL;
    size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if ((len == 1 && *p == '*') || (len == n && strncmp(p, origin, n) == 0))
            return origin;
        p = e ? e + 1 : p + len;
    }
    return NULL;
}

enum MHD_Result server_reply(struct conn_ctx *cc, int status, const char *content_type, char *body)
{
    size_t n = body ? strlen(body) : 0;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body ? body : (char *)"",
                                                             body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == 503)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 405 || status == 204)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, ep_takes_post(cc->ep) ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
    const char *origin = cors_origin(cc);
    if (origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
        if (status == 204) { /* a preflight */
            MHD_add_response_header(r, "Access-Control-Allow-Methods", ep_takes_post(cc->ep) ? "POST, OPTIONS"
                                                                                               : "GET, HEAD, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        }
    }
    enum MHD_Result ret = MHD_queue_response(cc->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    metrics_count_request(&cc->srv->metrics, cc->ep, status);
    return ret;
}

enum MHD_Result server_reply_error(struct conn_ctx *cc, const struct api_error *e)
{
    char *body = api_error_json(e);
    if (!body)
        return MHD_NO;
    size_t n = strlen(body);
    char *nl = realloc(body, n + 2); /* a trailing newline, as curl users like */
    if (nl) {
        body = nl;
        memcpy(body + n, "\n", 2);
    }
    return server_reply(cc, e->http_status, "application/json", body);
}

bool server_client_gone(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return true;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) < 0)
        return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * sysconf(_SC_PAGESIZE);
}

static enum MHD_Result reply_metrics(struct conn_ctx *cc)
{
    struct scheduler_stats st;
    scheduler_get_stats(cc->srv->m.sch, &st);
    char *text = NULL;
    size_t len = 0;
    struct err err = {0};
    /* counted before rendering, so a scrape sees itself */
    metrics_count_request(&cc->srv->metrics, cc->ep, 200);
    if (metrics_render(&cc->srv->metrics, &st, rss_bytes(), &text, &len, &err))
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(cc->conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* Constant-time comparison, so the key cannot be guessed byte by byte from timings. */
static bool same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < na; i++)
        d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return d == 0;
}

static bool authorized(struct conn_ctx *cc)
{
    const char *key = cc->srv->o.api_key;
    if (!key)
        return true;
    const char *h = MHD_lookup_connection_value(cc->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return h && strncmp(h, "Bearer ", 7) == 0 && same_secret(h + 7, key);
}

static enum MHD_Result route(struct conn_ctx *cc, const char *url, const char *method)
{
    struct server *srv = cc->srv;
    struct api_error e;
    /* HEAD answers as GET does; libmicrohttpd leaves the body out */
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(method, "OPTIONS") == 0 && cc->ep != METRICS_EP_OTHER)
        return server_reply(cc, 204, "text/plain", NULL); /* Allow, and the CORS preflight's answer */
    if (cc->too_big) {
        api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                      "the request body is larger than the limit of %zu bytes", srv->o.max_body_bytes);
        return server_reply_error(cc, &e);
    }
    if (needs_key(cc->ep, url) && !authorized(cc)) {
        api_error_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                      "missing or wrong API key: send \"Authorization: Bearer KEY\"");
        return server_reply_error(cc, &e);
    }
    switch (cc->ep) {
    case METRICS_EP_COMPLETIONS:
    case METRICS_EP_CHAT:
    case METRICS_EP_RESPONSES:
        if (post && atomic_load(&srv->failed)) {
            api_error_set(&e, 503, "server_error", NULL, "rank_failed", "%s", srv->fail_msg);
            return server_reply_error(cc, &e);
        }
        if (post && atomic_load(&srv->draining)) {
            api_error_set(&e, 503, "server_error", NULL, "shutting_down", "the server is shutting down");
            return server_reply_error(cc, &e);
        }
        if (post)
            return server_generate(cc, cc->ep == METRICS_EP_CHAT        ? API_CHAT
                                       : cc->ep == METRICS_EP_RESPONSES ? API_RESPONSES
                                                                        : API_COMPLETIONS);
        break;
    case METRICS_EP_MODELS:
        if (get)
            return server_reply(cc, 200, "application/json",
                                api_models_json(srv->o.model_name, srv->created, srv->m.max_context));
        break;
    case METRICS_EP_HEALTH:
        if (get && atomic_load(&srv->failed)) {
            api_error_set(&e, 503, "server_error", NULL, "rank_failed", "%s", srv->fail_msg);
            return server_reply_error(cc, &e);
        }
        if (get)
            return server_reply(cc, 200, "application/json", strdup("{\"status\":\"ok\"}\n"));
        break;
    case METRICS_EP_METRICS:
        if (get)
            return reply_metrics(cc);
        break;
    case METRICS_EP_MODEL:
        if (get && strcmp(url + 11, srv->o.model_name) == 0)
            return server_reply(cc, 200, "application/json",
                                api_model_json(srv->o.model_name, srv->created, srv->m.max_context));
        if (get) {
            api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                          "the model '%.200s' does not exist: this server has '%.200s'", url + 11,
                          srv->o.model_name);
            return server_reply_error(cc, &e);
        }
        break;
    case METRICS_EP_TOKENIZE:
    case METRICS_EP_DETOKENIZE:
        if (post)
            return cc->ep == METRICS_EP_TOKENIZE ? server_tokenize(cc) : server_detokenize(cc);
        break;
    case METRICS_EP_PAGE:
        if (get)
            return server_reply(cc, 200, "text/html; charset=utf-8", strdup(server_chat_page()));
        break;
    case METRICS_EP_VERSION:
        if (get)
            return server_reply(cc, 200, "application/json", strdup("{\"version\":\"" MOESERVE_VERSION "\"}\n"));
        break;
    default:
        api_error_set(&e, 404, "invalid_request_error", NULL, "not_found", "no route for %.200s %.200s", method, url);
        return server_reply_error(cc, &e);
    }
    api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%.200s does not take %.20s", url,
                  method);
    return server_reply_error(cc, &e);
}

/* The client's slot in srv->clients (claimed when absent and claim), or NULL: the table full, or
 * an address of another family. Under conn_mu. */
static struct server_client *client_slot(struct server *srv, const struct sockaddr *sa, bool claim)
{
    unsigned char key[16];
    int len;
    if (sa->sa_family == AF_INET) {
        memcpy(key, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        len = 4;
    } else if (sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        len = 16;
    } else {
        return NULL;
    }
    uint32_t h = 2166136261u;
    for (int i = 0; i < len; i++)
        h = (h ^ key[i]) * 16777619u;
    /* len 0: never used (a probe ends), -1: freed (a probe goes on; a claim may take it) */
    struct server_client *freed = NULL;
    for (int probe = 0; probe < SERVER_CLIENT_SLOTS; probe++) {
        struct server_client *c = &srv->clients[(h + (uint32_t)probe) % SERVER_CLIENT_SLOTS];
        if (c->len == len && memcmp(c->addr, key, (size_t)len) == 0)
            return c;
        if (c->len == -1 && !freed)
            freed = c;
        if (c->len == 0) {
            freed = freed ? freed : c;
            break;
        }
    }
    if (!claim || !freed)
        return NULL;
    memcpy(freed->addr, key, (size_t)len);
    freed->len = len;
    freed->n_open = 0;
    return freed;
}

/* Counts connections as they open and close, per client address. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code)
{
    struct server *srv = cls;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    pthread_mutex_lock(&srv->conn_mu);
    struct server_client *c = ci && ci->client_addr ? client_slot(srv, ci->client_addr, code == MHD_CONNECTION_NOTIFY_STARTED) : NULL;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        srv->n_open++;
        if (c)
            c->n_open++;
        *socket_ctx = c;
    } else {
        srv->n_open--;
        c = *socket_ctx;
        if (c && --c->n_open == 0)
            c->len = -1; /* freed: probes go past it, a new address may take it */
    }
    pthread_mutex_unlock(&srv->conn_mu);
}

/* Past a connection limit: answered 503 (with Retry-After) instead of a reset. */
static bool over_connection_limits(struct conn_ctx *cc, struct api_error *e)
{
    struct server *srv = cc->srv;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(cc->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    pthread_mutex_lock(&srv->conn_mu);
    int all = srv->n_open, mine = 0;
    struct server_client *c = ci && ci->client_addr ? client_slot(srv, ci->client_addr, false) : NULL;
    if (c)
        mine = c->n_open;
    pthread_mutex_unlock(&srv->conn_mu);
    if (all > srv->o.max_connections)
        api_error_set(e, 503, "server_error", NULL, "too_many_connections",
                      "%d connections are open, more than the server's limit of %d", all, srv->o.max_connections);
    else if (mine > srv->o.max_per_client)
        api_error_set(e, 503, "server_error", NULL, "too_many_connections",
                      "your address has %d connections open, more than the limit of %d a client", mine,
                      srv->o.max_per_client);
    else
        return false;
    return true;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    struct server *srv = cls;
    struct conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc)
            return MHD_NO;
        cc->srv = srv;
        cc->conn = conn;
        cc->ep = endpoint_of(url);
        *con_cls = cc;
        struct api_error e;
        if (over_connection_limits(cc, &e)) {
            cc->refused = true;
            return server_reply_error(cc, &e);
        }
        /* the key is in the headers: an unauthenticated body is never read into memory (a CORS
         * preflight carries no key: it is answered without one, and reveals nothing) */
        if (needs_key(cc->ep, url) && strcmp(method, "OPTIONS") != 0 && !authorized(cc)) {
            cc->refused = true;
            return route(cc, url, method);
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
        if (declared > srv->o.max_body_bytes) {
            cc->too_big = true;
            if (declared / REFUSE_UNREAD_FACTOR > srv->o.max_body_bytes) /* answer now; the connection closes */
                return route(cc, url, method);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (cc->too_big || cc->refused)
            return MHD_YES;
        if (cc->len + n > srv->o.max_body_bytes) {
            cc->too_big = true;
            free(cc->body);
            cc->body = NULL;
            cc->len = cc->cap = 0;
            return MHD_YES;
        }
        if (cc->len + n + 1 > cc->cap) {
            size_t cap = cc->cap ? cc->cap : 4096;
            while (cap < cc->len + n + 1)
                cap *= 2;
            char *b = realloc(cc->body, cap);
            if (!b)
                return MHD_NO;
            cc->body = b;
            cc->cap = cap;
        }
        memcpy(cc->body + cc->len, upload_data, n);
        cc->len += n;
        cc->body[cc->len] = 0;
        return MHD_YES;
    }
    if (cc->refused)
        return MHD_YES; /* answered already */
    return route(cc, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    struct conn_ctx *cc = *con_cls;
    if (!cc)
        return;
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = 0;
    LOG_DEBUG("http: %s", msg);
}

enum status server_start(struct server *srv, const struct server_opts *o, const struct server_model *m,
                         struct err *err)
{
    memset(srv, 0, sizeof *srv);
    srv->o = *o;
    srv->m = *m;
    if (!srv->o.host)
        srv->o.host = "127.0.0.1";
    if (!srv->o.max_body_bytes)
        srv->o.max_body_bytes = 4u << 20;
    if (srv->o.max_connections <= 0)
        srv->o.max_connections = 1024;
    if (srv->o.max_per_client <= 0 || srv->o.max_per_client > srv->o.max_connections)
        srv->o.max_per_client = srv->o.max_connections;
    if (srv->o.idle_timeout <= 0)
        srv->o.idle_timeout = 600;
    srv->clients = calloc(SERVER_CLIENT_SLOTS, sizeof *srv->clients);
    if (!srv->clients)
        return err_set(err, STATUS_NOMEM, "server: out of memory");
    pthread_mutex_init(&srv->conn_mu, NULL);
    metrics_init(&srv->metrics);
    metrics_set_model(&srv->metrics, o->model_name);
    if (m->pm.tok && m->sch && m->sch->s) /* ~0.1 s for a 150k vocabulary */
        srv->grammar_vocab = api_format_vocab_new(m->pm.tok, &m->sch->s->desc);
    srv->created = (long)time(NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    srv->salt = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)ts.tv_sec;
    atomic_init(&srv->stopping, false);
    atomic_init(&srv->draining, false);
    atomic_init(&srv->n_live, 0);
    atomic_init(&srv->n_ids, 0);

    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int rc = getaddrinfo(srv->o.host, port, &hints, &ai);
    if (rc) {
        metrics_free(&srv->metrics);
        free(srv->clients);
        pthread_mutex_destroy(&srv->conn_mu);
        return err_set(err, STATUS_INVALID, "--host %s: %s", srv->o.host, gai_strerror(rc));
    }
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    srv->daemon = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
        /* the hard limit sits above ours, so that the first connections past ours get a 503 */
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->o.max_connections + 64u, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)srv->o.idle_timeout, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, srv, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!srv->daemon) {
        metrics_free(&srv->metrics);
        free(srv->clients);
        pthread_mutex_destroy(&srv->conn_mu);
        return err_set(err, STATUS_IO, "cannot listen on %s:%d (in use, or not an address of this machine?)",
                       srv->o.host, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : o->port;
    return STATUS_OK;
}

int server_port(const struct server *srv)
{
    return srv->port;
}

void server_drain(struct server *srv, double grace)
{
    if (!srv->daemon)
        return;
    atomic_store(&srv->draining, true);
    double t0 = timer_now();
    /* the generations being answered, not the scheduler's published counts: those lag a step
     * behind the first token a client already has */
    while (atomic_load(&srv->n_live) > 0 && timer_now() - t0 < grace)
        usleep(20 * 1000);
    scheduler_stop(srv->m.sch); /* what is left ends as cancelled: its threads write the ends */
    for (double t1 = timer_now(); atomic_load(&srv->n_live) > 0 && timer_now() - t1 < 2.0;)
        usleep(10 * 1000);
}

void server_fail(struct server *srv, const char *msg)
{
    if (!srv->daemon || atomic_load(&srv->failed))
        return;
    snprintf(srv->fail_msg, sizeof srv->fail_msg, "%s", msg);
    atomic_store(&srv->draining, true);
    atomic_store(&srv->failed, true);
}

void server_stop(struct server *srv)
{
    if (!srv->daemon)
        return;
    /* waiting connection threads see this within one poll interval and end */
    atomic_store(&srv->stopping, true);
    MHD_stop_daemon(srv->daemon);
    metrics_free(&srv->metrics);
    api_format_vocab_free(srv->grammar_vocab);
    free(srv->clients);
    pthread_mutex_destroy(&srv->conn_mu);
    memset(srv, 0, sizeof *srv);
}
