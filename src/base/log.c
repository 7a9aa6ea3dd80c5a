/* log.c — see log.h. */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>

static enum log_level g_level = LOG_LEVEL_INFO;

void log_set_level(enum log_level level)
{
    g_level = level;
}

enum log_level log_get_level(void)
{
    return g_level;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    if (level > g_level)
        return;
    static const char *const prefix[] = {"error: ", "warning: ", "", "debug: "};
    fprintf(stderr, "%s", prefix[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
