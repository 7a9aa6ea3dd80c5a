/* cuda_check.c — see cuda_check.h. */
#include "backend/cuda/cuda_check.h"

#include "base/log.h"

bool cuda_check(struct cuda_error_sink *sink, struct cuda_result r, const char *expr, const char *file,
                int line)
{
    if (r.ok)
        return true;
    LOG_ERROR("%s:%d: %s: %s error %s (%s)", file, line, expr, r.api, r.name ? r.name : "?",
              r.msg ? r.msg : "?");
    if (sink && !sink->failed) {
        sink->failed = true;
        err_set(&sink->err, STATUS_IO, "%s:%d: %s: %s error %s (%s)", file, line, expr, r.api,
                r.name ? r.name : "?", r.msg ? r.msg : "?");
    }
    return false;
}

enum status cuda_sink_status(const struct cuda_error_sink *sink, struct err *err)
{
    if (!sink->failed)
        return STATUS_OK;
    if (err)
        *err = sink->err;
    return sink->err.code;
}
