/* cmd_bench_serve.c — `moeserve bench serve`: load an OpenAI-compatible server, measure latency.
 *
 * For each concurrency level C, C client threads send --requests streamed
 * /v1/completions requests between them (each thread starts its next request
 * when its last one ends), every prompt a list of --input-len random token
 * ids, each asking for exactly --output-len tokens (temperature 0,
 * ignore_eos; --request-fields adds or replaces fields such as sampling parameters). From the server-sent events, per request: TTFT (send to first
 * token event), ITL (gaps between token events), TPOT ((last - first) /
 * (tokens - 1)), end-to-end latency; per level: throughput, and mean, median
 * and p99 of each. Plain sockets and HTTP/1.1 (chunked or not); one
 * connection per request.
 *
 * Not here: HTTPS, prompt text (ids need no tokenizer and give exact lengths).
 */
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/json.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/cli_args.h"
#include "cli/commands.h"

enum { MAX_LEVELS = 16, IO_BUF = 1 << 16 };

struct bench_target {
    char host[256], port[16], prefix[256];
    const char *model;
    const char *api_key;
    int input_len, output_len, vocab;
    uint64_t seed;
    double timeout;
    const char *response_format; /* JSON text put in every request as response_format, or NULL */
    char *extra;                 /* ",\"key\":value..." of --request-fields, owned, or NULL */
    bool own_temperature, own_max_tokens, own_ignore_eos; /* --request-fields replaces these defaults */
};

/* --request-fields: a JSON object whose members go into every request (sampling parameters,
 * structured output), replacing the defaults of the same name; the fields the measurement rests
 * on (model, prompt, stream, stream_options) stay the benchmark's. */
static enum status target_set_fields(struct bench_target *t, const char *text, struct err *err)
{
    struct json *j = NULL;
    enum status st = json_parse(text, strlen(text), "--request-fields", &j, err);
    if (st)
        return st;
    if (!json_is_object(j)) {
        json_free(j);
        return err_set(err, STATUS_INVALID, "--request-fields: want a JSON object, e.g. '{\"frequency_penalty\": 0.5}'");
    }
    static const char *const KEEP[] = {"model", "prompt", "stream", "stream_options", "response_format"};
    size_t cap = strlen(text) * 2 + 64, n = 0;
    t->extra = malloc(cap);
    for (const struct json *m = json_child(j); m && t->extra; m = json_next(m)) {
        const char *k = json_key(m);
        for (size_t i = 0; i < sizeof KEEP / sizeof KEEP[0]; i++)
            if (strcmp(k, KEEP[i]) == 0) {
                st = err_set(err, STATUS_INVALID, "--request-fields: '%s' is the benchmark's own field%s", k,
                             i == 4 ? " (use --response-format)" : "");
                json_free(j);
                return st;
            }
        t->own_temperature |= strcmp(k, "temperature") == 0;
        t->own_max_tokens |= strcmp(k, "max_tokens") == 0;
        t->own_ignore_eos |= strcmp(k, "ignore_eos") == 0;
        char *v = json_print(m, false);
        if (!v)
            break;
        n += (size_t)snprintf(t->extra + n, cap - n, ",\"%s\":%s", k, v);
        free(v);
    }
    json_free(j);
    if (!t->extra || n >= cap)
        return err_set(err, STATUS_NOMEM, "--request-fields: out of memory");
    return STATUS_OK;
}

/* One request's measurements. */
struct bench_sample {
    bool ok;
    char error[160];
    double ttft, e2e, tpot;
    int n_out;          /* tokens the usage chunk reports (else token events) */
    double *itl;        /* (n_itl) owned */
    int n_itl;
};

struct bench_level {
    int concurrency, n_requests;
    atomic_int next;
    struct bench_sample *samples; /* (n_requests) */
    const struct bench_target *t;
};

static enum status parse_url(const char *url, struct bench_target *t, struct err *err)
{
    if (strncmp(url, "http://", 7) != 0)
        return err_set(err, STATUS_INVALID, "--url %s: only http:// URLs are supported", url);
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    const char *colon = memchr(h, ':', hl);
    if (hl == 0 || hl >= sizeof t->host)
        return err_set(err, STATUS_INVALID, "--url %s: no host", url);
    snprintf(t->host, sizeof t->host, "%.*s", (int)(colon ? colon - h : (long)hl), h);
    snprintf(t->port, sizeof t->port, "%.*s", colon ? (int)(hl - (size_t)(colon - h) - 1) : 2, colon ? colon + 1 : "80");
    snprintf(t->prefix, sizeof t->prefix, "%s", slash ? slash : "");
    size_t pl = strlen(t->prefix);
    while (pl && t->prefix[pl - 1] == '/')
        t->prefix[--pl] = 0;
    return STATUS_OK;
}

static int connect_to(const struct bench_target *t)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(t->host, t->port, &hints, &ai))
        return -1;
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
        struct timeval tv = {.tv_sec = (time_t)t->timeout, .tv_usec = 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    return fd;
}

static bool send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

/* Buffered reader over the socket. */
struct rd {
    int fd;
    char buf[IO_BUF];
    size_t pos, len;
    double t_recv; /* when the bytes now in buf arrived */
};

static bool rd_fill(struct rd *r)
{
    if (r->pos == r->len)
        r->pos = r->len = 0;
    if (r->len == sizeof r->buf) {
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    ssize_t k = recv(r->fd, r->buf + r->len, sizeof r->buf - r->len, 0);
    if (k <= 0)
        return false;
    r->len += (size_t)k;
    r->t_recv = timer_now();
    return true;
}

/* A CRLF- or LF-terminated line, without the terminator. */
static bool rd_line(struct rd *r, char *out, size_t cap)
{
    size_t n = 0;
    for (;;) {
        while (r->pos < r->len) {
            char c = r->buf[r->pos++];
            if (c == '\n') {
                if (n && out[n - 1] == '\r')
                    n--;
                out[n] = 0;
                return true;
            }
            if (n + 1 < cap)
                out[n++] = c;
        }
        if (!rd_fill(r))
            return false;
    }
}

/* Server-sent events: data lines accumulate until a blank line. */
struct sse {
    char *data;
    size_t len, cap;
    char line[IO_BUF];
    size_t line_len;
    struct bench_sample *s;
    double t_send, t_first, t_last;
    int n_events;
    double *itl;
    int n_itl, cap_itl;
    bool done;
};

static void sse_event(struct sse *e, double t)
{
    if (e->len == 0)
        return;
    e->data[e->len] = 0;
    if (strcmp(e->data, "[DONE]") == 0) {
        e->done = true;
        return;
    }
    struct json *j = NULL;
    if (json_parse(e->data, e->len, "event", &j, NULL))
        return;
    const struct json *err = json_get(j, "error");
    if (err && !json_is_null(err)) {
        const char *m = json_string(json_get(err, "message"));
        snprintf(e->s->error, sizeof e->s->error, "server: %s", m ? m : "error event");
    }
    if (json_array_size(json_get(j, "choices")) > 0) {
        if (e->n_events == 0) {
            e->t_first = t;
        } else {
            if (e->n_itl == e->cap_itl) {
                e->cap_itl = e->cap_itl ? 2 * e->cap_itl : 64;
                e->itl = realloc(e->itl, (size_t)e->cap_itl * sizeof *e->itl);
            }
            if (e->itl)
                e->itl[e->n_itl++] = t - e->t_last;
        }
        e->t_last = t;
        e->n_events++;
    }
    const struct json *u = json_get(j, "usage");
    if (json_is_object(u))
        e->s->n_out = (int)json_number(json_get(u, "completion_tokens"));
    json_free(j);
}

static void sse_feed(struct sse *e, const char *p, size_t n, double t)
{
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c != '\n') {
            if (e->line_len + 1 < sizeof e->line)
                e->line[e->line_len++] = c;
            continue;
        }
        if (e->line_len && e->line[e->line_len - 1] == '\r')
            e->line_len--;
        if (e->line_len == 0) {
            sse_event(e, t);
            e->len = 0;
        } else if (e->line_len >= 5 && memcmp(e->line, "data:", 5) == 0) {
            size_t off = e->line[5] == ' ' ? 6 : 5, k = e->line_len - off;
            if (e->len + k + 2 > e->cap) {
                e->cap = (e->len + k + 2) * 2;
                e->data = realloc(e->data, e->cap);
            }
            if (e->data) {
                memcpy(e->data + e->len, e->line + off, k);
                e->len += k;
            }
        }
        e->line_len = 0;
    }
}

/* The completion request's JSON body into body (cap bytes): a prompt of random ids from this
 * request's own stream, so requests differ but a seed replays them; its length. */
static size_t request_build_body(const struct bench_target *t, int index, char *body, size_t cap)
{
    uint64_t x = t->seed * 0x9E3779B97F4A7C15ull + (uint64_t)index * 0xBF58476D1CE4E5B9ull + 1;
    size_t n = (size_t)snprintf(body, cap, "{\"model\":\"%s\",\"prompt\":[", t->model);
    for (int i = 0; i < t->input_len; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        n += (size_t)snprintf(body + n, cap - n, "%s%d", i ? "," : "", 16 + (int)((x >> 33) % (uint64_t)(t->vocab - 16)));
    }
    n += (size_t)snprintf(body + n, cap - n, "],\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    if (!t->own_max_tokens)
        n += (size_t)snprintf(body + n, cap - n, ",\"max_tokens\":%d", t->output_len);
    if (!t->own_temperature)
        n += (size_t)snprintf(body + n, cap - n, ",\"temperature\":0");
    if (!t->own_ignore_eos)
        n += (size_t)snprintf(body + n, cap - n, ",\"ignore_eos\":true");
    n += (size_t)snprintf(body + n, cap - n, "%s%s%s}", t->response_format ? ",\"response_format\":" : "",
                          t->response_format ? t->response_format : "", t->extra ? t->extra : "");
    return n;
}

/* Feeds the response body (after the headers) to e until [DONE], the body's end or a dropped
 * connection; each byte carries the time it arrived. */
static void sse_read_stream(struct rd *r, struct sse *e, bool chunked)
{
    char line[1024];
    while (!e->done) {
        if (chunked) {
            if (!rd_line(r, line, sizeof line))
                break;
            size_t left = strtoul(line, NULL, 16);
            if (left == 0)
                break;
            while (left) {
                if (r->pos == r->len && !rd_fill(r))
                    return;
                size_t k = r->len - r->pos < left ? r->len - r->pos : left;
                sse_feed(e, r->buf + r->pos, k, r->t_recv);
                r->pos += k;
                left -= k;
            }
            rd_line(r, line, sizeof line); /* the chunk's CRLF */
        } else {
            if (r->pos == r->len && !rd_fill(r))
                break;
            sse_feed(e, r->buf + r->pos, r->len - r->pos, r->t_recv);
            r->pos = r->len;
        }
    }
}

static void run_one(const struct bench_target *t, int index, struct bench_sample *s)
{
    memset(s, 0, sizeof *s);
    /* the prompt: random ids from this request's own stream */
    size_t cap = (size_t)t->input_len * 12 + 512 + (t->response_format ? strlen(t->response_format) + 32 : 0) +
                 (t->extra ? strlen(t->extra) : 0);
    char *body = malloc(cap), *req = malloc(cap + 1024);
    struct sse e = {.s = s};
    struct rd *r = malloc(sizeof *r);
    int fd = -1;
    if (!body || !req || !r) {
        snprintf(s->error, sizeof s->error, "out of memory");
        goto out;
    }
    size_t n = request_build_body(t, index, body, cap);
    char auth[512] = "";
    if (t->api_key)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", t->api_key);
    size_t rn = (size_t)snprintf(req, cap + 1024,
                                 "POST %s/v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                                 "Accept: text/event-stream\r\n%sContent-Length: %zu\r\nConnection: close\r\n\r\n",
                                 t->prefix, t->host, t->port, auth, n);
    fd = connect_to(t);
    if (fd < 0) {
        snprintf(s->error, sizeof s->error, "cannot connect to %s:%s", t->host, t->port);
        goto out;
    }
    e.t_send = timer_now();
    if (!send_all(fd, req, rn) || !send_all(fd, body, n)) {
        snprintf(s->error, sizeof s->error, "send failed");
        goto out;
    }
    memset(r, 0, sizeof *r);
    r->fd = fd;
    char line[1024];
    int status = 0;
    bool chunked = false;
    if (!rd_line(r, line, sizeof line) || sscanf(line, "HTTP/%*s %d", &status) != 1) {
        snprintf(s->error, sizeof s->error, "no HTTP status line");
        goto out;
    }
    while (rd_line(r, line, sizeof line) && line[0])
        if (strncasecmp(line, "Transfer-Encoding:", 18) == 0 && strstr(line + 18, "chunked"))
            chunked = true;
    if (status != 200) {
        snprintf(s->error, sizeof s->error, "HTTP %d", status);
        goto out;
    }
    sse_read_stream(r, &e, chunked);
    double t_end = timer_now();
    if (!e.done && !s->error[0])
        snprintf(s->error, sizeof s->error, "the stream ended without [DONE]");
    if (!s->error[0] && e.n_events > 0) {
        s->ok = true;
        if (s->n_out == 0)
            s->n_out = e.n_events;
        s->ttft = e.t_first - e.t_send;
        s->e2e = t_end - e.t_send;
        s->tpot = s->n_out > 1 ? (e.t_last - e.t_first) / (s->n_out - 1) : 0;
        s->itl = e.itl;
        s->n_itl = e.n_itl;
        e.itl = NULL;
    } else if (!s->error[0]) {
        snprintf(s->error, sizeof s->error, "no token events");
    }
out:
    if (fd >= 0)
        close(fd);
    free(e.data);
    free(e.itl);
    free(r);
    free(body);
    free(req);
}

static void *level_worker(void *arg)
{
    struct bench_level *lv = arg;
    for (;;) {
        int i = atomic_fetch_add(&lv->next, 1);
        if (i >= lv->n_requests)
            return NULL;
        run_one(lv->t, i, &lv->samples[i]);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct stat3 {
    double mean, p50, p99;
};

/* Sorts v. Percentiles by linear interpolation between ranks. */
static struct stat3 stats_of(double *v, int n)
{
    struct stat3 s = {0, 0, 0};
    if (n == 0)
        return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    s.mean = sum / n;
    double q[2] = {0.5, 0.99}, *out[2] = {&s.p50, &s.p99};
    for (int k = 0; k < 2; k++) {
        double pos = q[k] * (n - 1);
        int lo = (int)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
        *out[k] = v[lo] + (v[hi] - v[lo]) * (pos - lo);
    }
    return s;
}

struct level_report {
    int concurrency, n_requests, n_ok;
    double duration, req_s, in_tok_s, out_tok_s;
    struct stat3 ttft, tpot, itl, e2e; /* seconds */
    char first_error[160];
};

static void level_summarize(struct bench_level *lv, double duration, struct level_report *rep)
{
    memset(rep, 0, sizeof *rep);
    rep->concurrency = lv->concurrency;
    rep->n_requests = lv->n_requests;
    rep->duration = duration;
    int n = lv->n_requests, n_itl = 0;
    long out_tokens = 0;
    for (int i = 0; i < n; i++)
        n_itl += lv->samples[i].n_itl;
    double *ttft = malloc((size_t)(n + 1) * sizeof(double)), *tpot = malloc((size_t)(n + 1) * sizeof(double));
    double *e2e = malloc((size_t)(n + 1) * sizeof(double)), *itl = malloc((size_t)(n_itl + 1) * sizeof(double));
    int k = 0, m = 0, kt = 0;
    for (int i = 0; i < n && ttft && tpot && e2e && itl; i++) {
        struct bench_sample *s = &lv->samples[i];
        if (!s->ok) {
            if (!rep->first_error[0])
                snprintf(rep->first_error, sizeof rep->first_error, "%s", s->error);
            continue;
        }
        rep->n_ok++;
        out_tokens += s->n_out;
        ttft[k] = s->ttft;
        e2e[k++] = s->e2e;
        if (s->n_out > 1)
            tpot[kt++] = s->tpot;
        for (int j = 0; j < s->n_itl; j++)
            itl[m++] = s->itl[j];
    }
    rep->req_s = rep->n_ok / duration;
    rep->in_tok_s = (double)rep->n_ok * lv->t->input_len / duration;
    rep->out_tok_s = (double)out_tokens / duration;
    if (ttft && tpot && e2e && itl) {
        rep->ttft = stats_of(ttft, k);
        rep->e2e = stats_of(e2e, k);
        rep->tpot = stats_of(tpot, kt);
        rep->itl = stats_of(itl, m);
    }
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
}

static struct json *stat_json(struct stat3 s)
{
    struct json *o = json_new_object();
    json_add(o, "mean", json_new_number(s.mean * 1e3));
    json_add(o, "p50", json_new_number(s.p50 * 1e3));
    json_add(o, "p99", json_new_number(s.p99 * 1e3));
    return o;
}

/* The served model's id, from GET /v1/models. */
static enum status ask_model(struct bench_target *t, char *out, size_t cap, struct err *err)
{
    int fd = connect_to(t);
    if (fd < 0)
        return err_set(err, STATUS_IO, "cannot connect to %s:%s", t->host, t->port);
    char req[1024], auth[512] = "";
    if (t->api_key)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", t->api_key);
    int n = snprintf(req, sizeof req, "GET %s/v1/models HTTP/1.1\r\nHost: %s:%s\r\n%sConnection: close\r\n\r\n",
                     t->prefix, t->host, t->port, auth);
    static char resp[1 << 16];
    size_t len = 0;
    if (send_all(fd, req, (size_t)n)) {
        ssize_t k;
        while (len + 1 < sizeof resp && (k = recv(fd, resp + len, sizeof resp - 1 - len, 0)) > 0)
            len += (size_t)k;
    }
    close(fd);
    resp[len] = 0;
    char *body = strstr(resp, "\r\n\r\n");
    const char *id = NULL;
    struct json *j = NULL;
    /* the list is small: whole or one chunk; find the JSON object inside */
    char *open = body ? strchr(body, '{') : NULL, *close_ = open ? strrchr(open, '}') : NULL;
    if (open && close_ && !json_parse(open, (size_t)(close_ - open + 1), "/v1/models", &j, NULL))
        id = json_string(json_get(json_array_at(json_get(j, "data"), 0), "id"));
    if (id)
        snprintf(out, cap, "%s", id);
    json_free(j);
    return id ? STATUS_OK : err_set(err, STATUS_FORMAT, "GET /v1/models gave no model id (pass --model)");
}

int cmd_bench_serve(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "url", .metavar = "URL", .help = "server base URL (default http://127.0.0.1:8000)"},
        {.name = "model", .metavar = "NAME", .help = "model id to request (default: the first of /v1/models)"},
        {.name = "concurrency", .metavar = "C,C,..", .help = "concurrent clients per level (default 1,8,64)"},
        {.name = "requests", .metavar = "N", .help = "requests per level (default 4 x concurrency, at least 8)"},
        {.name = "input-len", .metavar = "N", .help = "prompt tokens per request (default 128)"},
        {.name = "output-len", .metavar = "N", .help = "generated tokens per request (default 64)"},
        {.name = "vocab", .metavar = "N", .help = "prompt ids are drawn from [16, N) (default 4000)"},
        {.name = "seed", .metavar = "S", .help = "seed of the random prompts (default 1)"},
        {.name = "response-format", .metavar = "JSON",
         .help = "response_format of every request (structured output's cost; a grammar may end a request "
                 "before --output-len)"},
        {.name = "request-fields", .metavar = "JSON",
         .help = "a JSON object whose fields go into every request, replacing the defaults (temperature 0, "
                 "max_tokens = --output-len, ignore_eos true): sampling parameters' cost, e.g. "
                 "'{\"temperature\": 1, \"frequency_penalty\": 0.5}'"},
        {.name = "api-key", .metavar = "KEY", .help = "sent as a Bearer token (default $MOESERVE_API_KEY)"},
        {.name = "timeout", .metavar = "S", .help = "seconds without data before a request fails (default 600)"},
        {.name = "json", .help = "print JSON instead of a table"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result cr = cli_parse(argc, argv, opts, n, &err);
    if (cr == CLI_HELP) {
        cli_print_help("moeserve bench serve --url URL [--concurrency 1,8,64] [--input-len N] [--output-len M] [--json]",
                       "Loads an OpenAI-compatible server with streamed completions at each concurrency; reports "
                       "throughput, TTFT, TPOT, ITL and end-to-end latency (mean, p50, p99, in ms).",
                       opts, n);
        return 0;
    }
    struct bench_target t = {0};
    long in_len = 128, out_len = 64, vocab = 4000, seed = 1, n_req = 0;
    double timeout = 600;
    if (cr == CLI_ERROR || parse_url(cli_get(opts, n, "url", "http://127.0.0.1:8000"), &t, &err) ||
        cli_int(opts, n, "input-len", 1, 1 << 20, &in_len, &err) ||
        cli_int(opts, n, "output-len", 1, 1 << 20, &out_len, &err) || cli_int(opts, n, "vocab", 17, 1 << 30, &vocab, &err) ||
        cli_int(opts, n, "seed", 0, 1L << 40, &seed, &err) || cli_int(opts, n, "requests", 1, 1 << 20, &n_req, &err) ||
        cli_float(opts, n, "timeout", 0.001, 1e6, &timeout, &err)) {
        LOG_ERROR("bench serve: %s", err.msg);
        return 2;
    }
    int levels[MAX_LEVELS], n_levels = 0;
    const char *cs = cli_get(opts, n, "concurrency", "1,8,64");
    for (const char *c = cs; *c;) {
        char *end;
        long v = strtol(c, &end, 10);
        if (end == c || v < 1 || v > 4096 || (*end && *end != ',') || n_levels == MAX_LEVELS) {
            LOG_ERROR("bench serve: --concurrency \"%s\" is not a list of at most %d numbers in 1..4096", cs, MAX_LEVELS);
            return 2;
        }
        levels[n_levels++] = (int)v;
        c = *end ? end + 1 : end;
    }
    t.input_len = (int)in_len;
    t.output_len = (int)out_len;
    t.vocab = (int)vocab;
    t.seed = (uint64_t)seed;
    t.timeout = timeout;
    t.api_key = cli_get(opts, n, "api-key", cli_env_api_key());
    t.response_format = cli_get(opts, n, "response-format", NULL);
    const char *fields = cli_get(opts, n, "request-fields", NULL);
    if (fields && target_set_fields(&t, fields, &err)) {
        LOG_ERROR("bench serve: %s", err.msg);
        free(t.extra);
        return 2;
    }
    char model[256];
    t.model = cli_get(opts, n, "model", NULL);
    if (!t.model) {
        if (ask_model(&t, model, sizeof model, &err)) {
            LOG_ERROR("bench serve: %s", err.msg);
            free(t.extra);
            return 1;
        }
        t.model = model;
    }
    struct level_report reps[MAX_LEVELS];
    int rc = 0;
    for (int l = 0; l < n_levels; l++) {
        struct bench_level lv = {.concurrency = levels[l], .t = &t};
        lv.n_requests = n_req ? (int)n_req : (4 * levels[l] > 8 ? 4 * levels[l] : 8);
        atomic_init(&lv.next, 0);
        lv.samples = calloc((size_t)lv.n_requests, sizeof *lv.samples);
        pthread_t *th = calloc((size_t)levels[l], sizeof *th);
        if (!lv.samples || !th) {
            LOG_ERROR("bench serve: out of memory");
            free(t.extra);
            return 1;
        }
        LOG_INFO("bench serve: concurrency %d, %d requests of %ld+%ld tokens", levels[l], lv.n_requests, in_len, out_len);
        double t0 = timer_now();
        int started = 0;
        for (int i = 0; i < levels[l]; i++)
            started += pthread_create(&th[i], NULL, level_worker, &lv) == 0;
        for (int i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        level_summarize(&lv, timer_now() - t0, &reps[l]);
        if (reps[l].n_ok < reps[l].n_requests) {
            LOG_ERROR("bench serve: %d of %d requests failed (first: %s)", reps[l].n_requests - reps[l].n_ok,
                      reps[l].n_requests, reps[l].first_error);
            rc = 1;
        }
        for (int i = 0; i < lv.n_requests; i++)
            free(lv.samples[i].itl);
        free(lv.samples);
        free(th);
    }
    if (cli_flag(opts, n, "json")) {
        struct json *o = json_new_object();
        json_add(o, "model", json_new_string(t.model));
        json_add(o, "input_len", json_new_number((double)in_len));
        json_add(o, "output_len", json_new_number((double)out_len));
        struct json *rows = json_add(o, "levels", json_new_array());
        for (int l = 0; l < n_levels; l++) {
            const struct level_report *r = &reps[l];
            struct json *j = json_append(rows, json_new_object());
            json_add(j, "concurrency", json_new_number(r->concurrency));
            json_add(j, "requests", json_new_number(r->n_requests));
            json_add(j, "completed", json_new_number(r->n_ok));
            json_add(j, "duration_s", json_new_number(r->duration));
            json_add(j, "request_throughput", json_new_number(r->req_s));
            json_add(j, "input_tok_s", json_new_number(r->in_tok_s));
            json_add(j, "output_tok_s", json_new_number(r->out_tok_s));
            json_add(j, "ttft_ms", stat_json(r->ttft));
            json_add(j, "tpot_ms", stat_json(r->tpot));
            json_add(j, "itl_ms", stat_json(r->itl));
            json_add(j, "e2e_ms", stat_json(r->e2e));
        }
        char *s = json_print(o, true);
        printf("%s\n", s ? s : "{}");
        free(s);
        json_free(o);
    } else {
        printf("model %s, %ld input + %ld output tokens per request (ms: mean / p50 / p99)\n", t.model, in_len, out_len);
        printf("%5s %5s %5s %8s %8s %9s %23s %23s %23s %23s\n", "conc", "reqs", "ok", "req/s", "in tok/s", "out tok/s",
               "TTFT", "TPOT", "ITL", "E2E");
        for (int l = 0; l < n_levels; l++) {
            const struct level_report *r = &reps[l];
            printf("%5d %5d %5d %8.2f %8.1f %9.1f", r->concurrency, r->n_requests, r->n_ok, r->req_s, r->in_tok_s,
                   r->out_tok_s);
            const struct stat3 *st[4] = {&r->ttft, &r->tpot, &r->itl, &r->e2e};
            for (int k = 0; k < 4; k++)
                printf(" %7.1f/%7.1f/%7.1f", st[k]->mean * 1e3, st[k]->p50 * 1e3, st[k]->p99 * 1e3);
            printf("\n");
        }
    }
    free(t.extra);
    return rc;
}
