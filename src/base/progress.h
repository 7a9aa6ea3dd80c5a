/* progress.h — one self-overwriting progress line on stderr while loading.
 *
 * Redraws at most every 100 ms; on a non-terminal it prints only the final
 * line, so logs stay readable.
 *
 * defines: struct progress, progress_init(), progress_update(), progress_finish()
 */
#ifndef MOESERVE_BASE_PROGRESS_H
#define MOESERVE_BASE_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

struct progress {
    const char *label; /* borrowed */
    uint64_t total;    /* bytes or items; 0 = unknown */
    uint64_t done;
    double t_start;
    double t_last_draw;
    bool tty;
    bool quiet;
};

void progress_init(struct progress *p, const char *label, uint64_t total);
void progress_update(struct progress *p, uint64_t done);
void progress_finish(struct progress *p);

#endif
