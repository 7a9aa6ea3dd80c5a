/* safetensors_header.h — the JSON header of a safetensors file we write.
 *
 * {"__metadata__":{"format":"pt"},"name":{"dtype":..,"shape":[..],"data_offsets":[a,b]},...},
 * space-padded to a multiple of 8 bytes so the data section is 8-byte aligned (as the
 * reference writer does). Used by `moeserve quantize` and tools/make_synth_checkpoint.
 *
 * defines: struct st_header_entry, st_header_entry_fn, st_header_build()
 */
#ifndef MOESERVE_FORMAT_SAFETENSORS_HEADER_H
#define MOESERVE_FORMAT_SAFETENSORS_HEADER_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

struct st_header_entry {
    const char *name;
    enum dtype dtype;
    int n_dims;
    const int64_t *shape; /* (n_dims) */
    uint64_t begin, end;  /* byte range in the data section */
};

/* Fills e with tensor i of the caller's list. */
typedef void (*st_header_entry_fn)(const void *ctx, size_t i, struct st_header_entry *e);

/* The padded header of n tensors (malloc'ed, NUL-terminated); *len its length. NULL when out of memory. */
char *st_header_build(size_t n, st_header_entry_fn entry, const void *ctx, size_t *len);

#endif
