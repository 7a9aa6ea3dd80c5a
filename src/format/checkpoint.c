/* checkpoint.c — find, map and index the shards of a checkpoint directory
 * (see checkpoint.h).
 *
 * Steps: decide the list of shard file names (index.json, single file, or a
 * directory scan), stat them all (so a missing shard fails before anything is
 * mapped, and the progress line knows the total), map and validate each,
 * hash every tensor name, then, with an index, check the index against what
 * the shards really contain.
 *
 * The index is untrusted: shard names come from it and are joined to DIR, so
 * they are checked for path traversal before any filesystem call uses them.
 */
#include "format/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"
#include "base/progress.h"

#define CHECKPOINT_INDEX_NAME "model.safetensors.index.json"
#define CHECKPOINT_SINGLE_NAME "model.safetensors"
#define CHECKPOINT_SUFFIX ".safetensors"

/* A growable list of file names (relative to the directory). */
struct checkpoint_names {
    char **v; /* (n) owned strings */
    size_t n;
    size_t cap;
};

static void checkpoint_names_free(struct checkpoint_names *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static bool checkpoint_names_push(struct checkpoint_names *l, const char *s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = strdup(s);
    if (!l->v[l->n])
        return false;
    l->n++;
    return true;
}

static int checkpoint_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* malloc'ed "dir/name", or NULL on OOM. */
static char *checkpoint_path_join(const char *dir, const char *name)
{
    size_t ld = strlen(dir), ln = strlen(name);
    char *p = malloc(ld + 1 + ln + 1);
    if (!p)
        return NULL;
    memcpy(p, dir, ld);
    p[ld] = '/';
    memcpy(p + ld + 1, name, ln + 1);
    return p;
}

/* 1 if dir/name exists, 0 if not, -1 on OOM. */
static int checkpoint_exists(const char *dir, const char *name)
{
    char *p = checkpoint_path_join(dir, name);
    if (!p)
        return -1;
    struct stat sb;
    int r = stat(p, &sb) == 0;
    free(p);
    return r;
}

/* Reads the index's weight_map into a sorted list of distinct shard names.
 * *weight_map points into *root, which the caller frees. */
static enum status checkpoint_read_index(const char *dir, struct json **root,
                                         const struct json **weight_map,
                                         struct checkpoint_names *shards, struct err *err)
{
    char *ipath = checkpoint_path_join(dir, CHECKPOINT_INDEX_NAME);
    if (!ipath)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", dir);
    enum status st = json_parse_file(ipath, root, err);
    if (st)
        goto out;
    const struct json *wm = json_get(*root, "weight_map");
    if (!json_is_object(wm)) {
        st = err_set(err, STATUS_FORMAT, "%s: no \"weight_map\" object", ipath);
        goto out;
    }
    if (!json_child(wm)) {
        st = err_set(err, STATUS_FORMAT, "%s: \"weight_map\" is empty", ipath);
        goto out;
    }
    /* Tensors repeat shard names thousands of times; dedupe through a map. */
    struct strmap seen = {0};
    if (!strmap_init(&seen, 64)) {
        st = err_set(err, STATUS_NOMEM, "%s: out of memory", ipath);
        goto out;
    }
    for (const struct json *m = json_child(wm); m; m = json_next(m)) {
        const char *shard = json_string(m);
        if (!shard) {
            st = err_set(err, STATUS_FORMAT, "%s: tensor %s: shard name is not a string", ipath,
                         json_key(m));
            break;
        }
        /* Shard names are joined to dir: nothing may lead outside it. */
        if (!shard[0] || strchr(shard, '/') || strstr(shard, "..")) {
            st = err_set(err, STATUS_FORMAT, "%s: tensor %s: invalid shard name \"%s\"", ipath,
                         json_key(m), shard);
            break;
        }
        if (strmap_get(&seen, shard))
            continue;
        /* Any non-NULL value marks "seen". */
        if (!strmap_put(&seen, shard, (void *)1, NULL) ||
            !checkpoint_names_push(shards, shard)) {
            st = err_set(err, STATUS_NOMEM, "%s: out of memory", ipath);
            break;
        }
    }
    strmap_free(&seen);
    if (st)
        goto out;
    qsort(shards->v, shards->n, sizeof *shards->v, checkpoint_cmp_str);
    *weight_map = wm;
out:
    free(ipath);
    return st;
}

/* Every DIR/NAME.safetensors (hidden files skipped: ._x.safetensors are macOS
 * resource forks, not tensors), sorted by name. */
static enum status checkpoint_scan_dir(const char *dir, struct checkpoint_names *files,
                                       struct err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return err_set(err, STATUS_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    const size_t ls = strlen(CHECKPOINT_SUFFIX);
    enum status st = STATUS_OK;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] == '.' || l <= ls || strcmp(e->d_name + l - ls, CHECKPOINT_SUFFIX) != 0)
            continue;
        if (!checkpoint_names_push(files, e->d_name)) {
            st = err_set(err, STATUS_NOMEM, "%s: out of memory", dir);
            break;
        }
    }
    closedir(d);
    if (st)
        return st;
    if (files->n == 0)
        return err_set(err, STATUS_NOT_FOUND,
                       "%s: no " CHECKPOINT_SINGLE_NAME " or " CHECKPOINT_INDEX_NAME, dir);
    qsort(files->v, files->n, sizeof *files->v, checkpoint_cmp_str);
    return STATUS_OK;
}

/* Index of the file that owns t, or n_files if none. A tensor's `file` is
 * its st_file's own path string, so pointer identity names the file (and,
 * unlike comparing tensor addresses across arrays, is defined behaviour). */
static size_t checkpoint_file_of(const struct checkpoint *c, const struct st_tensor *t)
{
    for (size_t k = 0; k < c->n_files; k++)
        if (t->file == c->files[k].map.path)
            return k;
    return c->n_files;
}

/* Binary search in the sorted name list (shards are few, names long). */
static size_t checkpoint_names_find(const struct checkpoint_names *l, const char *s)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(l->v[mid], s);
        if (r == 0)
            return mid;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return l->n;
}

/* Every weight_map entry must be in the shard it names (files[k] was opened
 * from names->v[k]), and named only once. */
static enum status checkpoint_check_index(const struct checkpoint *c,
                                          const struct json *weight_map,
                                          const struct checkpoint_names *names, struct err *err)
{
    struct strmap seen = {0};
    if (!strmap_init(&seen, checkpoint_count(c)))
        return err_set(err, STATUS_NOMEM, "%s: out of memory", c->dir);
    enum status st = STATUS_OK;
    for (const struct json *m = json_child(weight_map); m; m = json_next(m)) {
        const char *name = json_key(m), *shard = json_string(m);
        void *old = NULL;
        if (!strmap_put(&seen, name, (void *)1, &old)) {
            st = err_set(err, STATUS_NOMEM, "%s: out of memory", c->dir);
            break;
        }
        if (old) {
            st = err_set(err, STATUS_FORMAT, "%s/" CHECKPOINT_INDEX_NAME ": tensor %s is named twice",
                         c->dir, name);
            break;
        }
        size_t want = checkpoint_names_find(names, shard);
        ASSERT(want < names->n); /* names was built from this weight_map */
        const struct st_tensor *t = checkpoint_find(c, name);
        if (!t) {
            st = err_set(err, STATUS_FORMAT,
                         "%s/" CHECKPOINT_INDEX_NAME ": tensor %s: not in shard %s", c->dir, name,
                         shard);
            break;
        }
        size_t have = checkpoint_file_of(c, t);
        if (have != want) {
            st = err_set(err, STATUS_FORMAT,
                         "%s/" CHECKPOINT_INDEX_NAME ": tensor %s: not in shard %s (found in %s)",
                         c->dir, name, shard, t->file);
            break;
        }
    }
    strmap_free(&seen);
    return st;
}

/* Stats, maps and hashes every file in names. */
static enum status checkpoint_open_files(struct checkpoint *c, const struct checkpoint_names *names,
                                         bool from_index, struct err *err)
{
    uint64_t total = 0;
    for (size_t i = 0; i < names->n; i++) {
        char *p = checkpoint_path_join(c->dir, names->v[i]);
        if (!p)
            return err_set(err, STATUS_NOMEM, "%s: out of memory", c->dir);
        struct stat sb;
        int r = stat(p, &sb);
        int e = errno;
        free(p);
        if (r != 0) {
            if (from_index)
                return err_set(err, STATUS_NOT_FOUND,
                               "%s/" CHECKPOINT_INDEX_NAME " names shard %s but %s/%s is missing",
                               c->dir, names->v[i], c->dir, names->v[i]);
            return err_set(err, STATUS_IO, "%s/%s: cannot stat: %s", c->dir, names->v[i],
                           strerror(e));
        }
        total += (uint64_t)sb.st_size;
    }

    c->files = calloc(names->n, sizeof *c->files);
    if (!c->files)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", c->dir);

    char label[256];
    snprintf(label, sizeof label, "mapping %s", c->dir);
    struct progress prog;
    progress_init(&prog, label, total);
    enum status st = STATUS_OK;
    for (size_t i = 0; i < names->n && !st; i++) {
        char *p = checkpoint_path_join(c->dir, names->v[i]);
        if (!p) {
            st = err_set(err, STATUS_NOMEM, "%s: out of memory", c->dir);
            break;
        }
        st = st_file_open(&c->files[i], p, err);
        free(p);
        if (st)
            break;
        c->n_files = i + 1;
        c->total_bytes += c->files[i].map.size;
        progress_update(&prog, c->total_bytes);
    }
    progress_finish(&prog);
    if (st)
        return st;

    size_t n_tensors = checkpoint_count(c);
    if (!strmap_init(&c->by_name, n_tensors))
        return err_set(err, STATUS_NOMEM, "%s: out of memory", c->dir);
    for (size_t k = 0; k < c->n_files; k++) {
        const struct st_file *f = &c->files[k];
        for (size_t i = 0; i < f->n_tensors; i++) {
            const struct st_tensor *t = &f->tensors[i];
            void *old = NULL;
            if (!strmap_put(&c->by_name, t->name, (void *)t, &old))
                return err_set(err, STATUS_NOMEM, "%s: out of memory", c->dir);
            if (old)
                return err_set(err, STATUS_FORMAT, "%s: tensor %s is in both %s and %s", c->dir,
                               t->name, ((const struct st_tensor *)old)->file, t->file);
        }
    }
    return STATUS_OK;
}

enum status checkpoint_open(struct checkpoint *c, const char *dir, struct err *err)
{
    memset(c, 0, sizeof *c);
    c->dir = strdup(dir);
    if (!c->dir)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", dir);

    struct checkpoint_names names = {0};
    struct json *index = NULL;
    const struct json *weight_map = NULL;
    enum status st;
    int has_index = checkpoint_exists(dir, CHECKPOINT_INDEX_NAME);
    int has_single = has_index == 1 ? 0 : checkpoint_exists(dir, CHECKPOINT_SINGLE_NAME);
    if (has_index < 0 || has_single < 0) {
        st = err_set(err, STATUS_NOMEM, "%s: out of memory", dir);
    } else if (has_index) {
        st = checkpoint_read_index(dir, &index, &weight_map, &names, err);
    } else if (has_single) {
        st = checkpoint_names_push(&names, CHECKPOINT_SINGLE_NAME)
                 ? STATUS_OK
                 : err_set(err, STATUS_NOMEM, "%s: out of memory", dir);
    } else {
        st = checkpoint_scan_dir(dir, &names, err);
    }
    if (!st)
        st = checkpoint_open_files(c, &names, has_index == 1, err);
    if (!st && weight_map)
        st = checkpoint_check_index(c, weight_map, &names, err);

    json_free(index);
    checkpoint_names_free(&names);
    if (st)
        checkpoint_close(c);
    return st;
}

void checkpoint_close(struct checkpoint *c)
{
    for (size_t i = 0; i < c->n_files; i++)
        st_file_close(&c->files[i]);
    free(c->files);
    strmap_free(&c->by_name);
    free(c->dir);
    memset(c, 0, sizeof *c);
}

const struct st_tensor *checkpoint_find(const struct checkpoint *c, const char *name)
{
    return strmap_get(&c->by_name, name);
}

size_t checkpoint_count(const struct checkpoint *c)
{
    size_t n = 0;
    for (size_t k = 0; k < c->n_files; k++)
        n += c->files[k].n_tensors;
    return n;
}

const struct st_tensor *checkpoint_tensor_at(const struct checkpoint *c, size_t i)
{
    for (size_t k = 0; k < c->n_files; k++) {
        if (i < c->files[k].n_tensors)
            return &c->files[k].tensors[i];
        i -= c->files[k].n_tensors;
    }
    return NULL;
}
