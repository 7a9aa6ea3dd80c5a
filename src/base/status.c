/* status.c — error messages and panics (see status.h). */
#include "base/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum status err_set(struct err *err, enum status code, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

void err_prefix(struct err *err, const char *fmt, ...)
{
    if (!err)
        return;
    char prefix[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* build in a buffer big enough for both, then truncate into msg */
    char joined[2 * ERR_MSG_MAX + 2];
    size_t lp = strlen(prefix), lm = strnlen(err->msg, ERR_MSG_MAX - 1);
    memcpy(joined, prefix, lp);
    memcpy(joined + lp, ": ", 2);
    memcpy(joined + lp + 2, err->msg, lm);
    joined[lp + 2 + lm] = 0;
    size_t n = strlen(joined);
    if (n >= ERR_MSG_MAX)
        n = ERR_MSG_MAX - 1;
    memcpy(err->msg, joined, n);
    err->msg[n] = 0;
}

const char *status_name(enum status s)
{
    switch (s) {
    case STATUS_OK: return "ok";
    case STATUS_IO: return "i/o error";
    case STATUS_FORMAT: return "format error";
    case STATUS_INVALID: return "invalid argument";
    case STATUS_NOMEM: return "out of memory";
    case STATUS_UNSUPPORTED: return "unsupported";
    case STATUS_NOT_FOUND: return "not found";
    }
    return "unknown status";
}

void base_panic(const char *file, int line, const char *fmt, ...)
{
    fprintf(stderr, "moeserve: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
