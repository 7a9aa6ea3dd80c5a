/* mapped_file.h — a whole file mapped read-only (weights stay in the page cache).
 * defines: struct mapped_file, mapped_file_open(), mapped_file_close() */
#ifndef MOESERVE_BASE_MAPPED_FILE_H
#define MOESERVE_BASE_MAPPED_FILE_H

#include <stddef.h>

#include "base/status.h"

struct mapped_file {
    char *path;       /* owned copy, for error messages */
    const void *data; /* (size) bytes, read-only mapping; NULL when size == 0 */
    size_t size;
};

enum status mapped_file_open(struct mapped_file *mf, const char *path, struct err *err);
/* Safe on a zeroed struct. */
void mapped_file_close(struct mapped_file *mf);

#endif
