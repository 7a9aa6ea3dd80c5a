/* progress.c — see progress.h. */
#include "base/progress.h"

#include <stdio.h>
#include <unistd.h>

#include "base/log.h"
#include "base/timer.h"

void progress_init(struct progress *p, const char *label, uint64_t total)
{
    p->label = label;
    p->total = total;
    p->done = 0;
    p->t_start = timer_now();
    p->t_last_draw = 0;
    p->tty = isatty(2);
    p->quiet = log_get_level() < LOG_LEVEL_INFO;
}

static void progress_draw(const struct progress *p, double now, bool final)
{
    double dt = now - p->t_start;
    double mib = (double)p->done / (1024.0 * 1024.0);
    if (p->total)
        fprintf(stderr, "%s%s: %5.1f%% %.1f/%.1f MiB, %.1f s%s", p->tty ? "\r" : "", p->label,
                100.0 * (double)p->done / (double)p->total, mib,
                (double)p->total / (1024.0 * 1024.0), dt, final ? "\n" : "");
    else
        fprintf(stderr, "%s%s: %.1f MiB, %.1f s%s", p->tty ? "\r" : "", p->label, mib, dt,
                final ? "\n" : "");
    fflush(stderr);
}

void progress_update(struct progress *p, uint64_t done)
{
    p->done = done;
    if (p->quiet || !p->tty)
        return;
    double now = timer_now();
    if (now - p->t_last_draw < 0.1)
        return;
    p->t_last_draw = now;
    progress_draw(p, now, false);
}

void progress_finish(struct progress *p)
{
    if (p->quiet)
        return;
    progress_draw(p, timer_now(), true);
}
