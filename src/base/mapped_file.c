/* mapped_file.c — see mapped_file.h. Empty files map to data == NULL. */
#include "base/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum status mapped_file_open(struct mapped_file *mf, const char *path, struct err *err)
{
    memset(mf, 0, sizeof *mf);
    /* O_NONBLOCK: a FIFO in a file's place must not block the open (a regular file ignores it);
     * fstat then refuses it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return err_set(err, STATUS_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return err_set(err, STATUS_IO, "%s: not a regular file", path);
    }
    mf->path = strdup(path);
    if (!mf->path) {
        close(fd);
        return err_set(err, STATUS_NOMEM, "%s: out of memory", path);
    }
    mf->size = (size_t)sb.st_size;
    if (mf->size > 0) {
        void *p = mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            mapped_file_close(mf);
            return err_set(err, STATUS_IO, "%s: mmap failed: %s", path, strerror(e));
        }
        mf->data = p;
    }
    close(fd);
    return STATUS_OK;
}

void mapped_file_close(struct mapped_file *mf)
{
    if (mf->data)
        munmap((void *)mf->data, mf->size);
    free(mf->path);
    memset(mf, 0, sizeof *mf);
}
