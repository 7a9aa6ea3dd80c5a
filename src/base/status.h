/* status.h — the two error channels of moeserve.
 *
 * Recoverable failures (bad files, bad requests, out of memory) return an
 * enum status and fill a struct err whose message names the file, tensor or
 * field. Broken invariants (a bug in moeserve itself) use ASSERT/PANIC, which
 * abort with file:line. Only main() turns a status into an exit code.
 *
 * defines: enum status, struct err, err_set(), err_prefix(), status_name(),
 *          ASSERT(), PANIC()
 */
#ifndef MOESERVE_BASE_STATUS_H
#define MOESERVE_BASE_STATUS_H

#include <stdarg.h>
#include <stddef.h>

enum status {
    STATUS_OK = 0,
    STATUS_IO,          /* open/read/mmap failed */
    STATUS_FORMAT,      /* a file's content is malformed */
    STATUS_INVALID,     /* a caller-supplied value is out of range */
    STATUS_NOMEM,       /* an allocation failed */
    STATUS_UNSUPPORTED, /* well-formed, but not something we implement */
    STATUS_NOT_FOUND,   /* a named thing (tensor, file, key) is absent */
};

#define ERR_MSG_MAX 1024

struct err {
    enum status code;
    char msg[ERR_MSG_MAX];
};

/* Fills err (may be NULL) and returns code, so callers can write
 * `return err_set(err, STATUS_FORMAT, "%s: ...", path);`. */
enum status err_set(struct err *err, enum status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message (context added while unwinding). */
void err_prefix(struct err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *status_name(enum status s);

void base_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

#define PANIC(...) base_panic(__FILE__, __LINE__, __VA_ARGS__)
#define ASSERT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond))                                                                               \
            base_panic(__FILE__, __LINE__, "assertion failed: %s", #cond);                         \
    } while (0)

#endif
