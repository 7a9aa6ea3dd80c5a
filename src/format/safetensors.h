/* safetensors.h — a validated, zero-copy reader of one .safetensors file.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON header, then the
 * data section. The header maps tensor names to {dtype, shape, data_offsets}
 * (offsets relative to the data section) plus an optional "__metadata__"
 * object of strings.
 *
 * The file is untrusted input: every bound is checked before a tensor is
 * exposed, and every failure is a clean error naming the file and tensor.
 * After a successful open, for every tensor: data lies inside the data
 * section, n_bytes == numel * dtype_size(dtype) with no overflow, n_dims <= 8,
 * no two tensors share a byte, and names are unique.
 *
 * Deliberately not done: no copies or conversions of tensor data (data is
 * borrowed from the mapping); no alignment guarantee (safetensors does not
 * require the header to be padded, so `data` may be unaligned for its dtype —
 * consumers that need alignment must check); gaps between tensors and unused
 * trailing bytes are allowed; unknown keys inside a tensor entry are ignored.
 *
 * defines: struct st_tensor, struct st_file, st_file_open(), st_parse_buffer(),
 *          st_file_close(), st_file_find(), st_tensor_numel(), ST_MAX_DIMS,
 *          ST_MAX_HEADER_BYTES
 */
#ifndef MOESERVE_FORMAT_SAFETENSORS_H
#define MOESERVE_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/json.h"
#include "base/mapped_file.h"
#include "base/status.h"

#define ST_MAX_DIMS 8
/* Same cap as the reference implementation: a bigger header is an attack or a
 * corrupt length, not a model. */
#define ST_MAX_HEADER_BYTES 100000000ull

struct st_tensor {
    char *name;                   /* owned */
    enum dtype dtype;
    int n_dims;                   /* 0 (scalar) .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];   /* (n_dims) outermost first; entries >= n_dims are 0 */
    const void *data;             /* (n_bytes) borrowed from the mapping; may be unaligned */
    size_t n_bytes;
    const char *file;             /* borrowed: the st_file's path (or st_parse_buffer's name) */
};

struct st_file {
    struct mapped_file map;     /* zeroed when parsed from a caller's buffer */
    struct st_tensor *tensors;  /* (n_tensors) owned, in header order */
    size_t n_tensors;
    struct json *metadata;      /* the __metadata__ object (string values) or NULL; owned */
};

/* Maps `path` and parses it. On failure *f is left zeroed. */
enum status st_file_open(struct st_file *f, const char *path, struct err *err);

/* Parses a safetensors image already in memory. Tensor data and `file` are
 * borrowed: buf and name must outlive *f. f->map is left untouched, so
 * st_file_open can parse its own mapping; on failure f->tensors and
 * f->metadata are NULL. Exposed for the fuzz target. */
enum status st_parse_buffer(struct st_file *f, const void *buf, size_t size, const char *name,
                            struct err *err);

/* Safe on a zeroed struct; leaves *f zeroed. */
void st_file_close(struct st_file *f);

/* Linear search (checkpoint.c hashes names across files); NULL if absent. */
const struct st_tensor *st_file_find(const struct st_file *f, const char *name);

/* Number of elements: 1 for a scalar, 0 if any dimension is 0. */
int64_t st_tensor_numel(const struct st_tensor *t);

#endif
