/* checkpoint.h — the safetensors files of a Hugging Face checkpoint directory.
 *
 * Which files: DIR/model.safetensors.index.json if present (its "weight_map"
 * names the shards), else DIR/model.safetensors, else every DIR/NAME.safetensors
 * in name order. Every file is mapped and validated (safetensors.h) and every
 * tensor name is hashed once, so lookups stay O(1) on checkpoints with ~90k
 * tensors.
 *
 * Invariants after a successful open: tensor names are unique across all
 * files; with an index, every tensor it names is in the shard it names, and
 * no shard name escapes DIR ('/' and ".." are rejected).
 *
 * Deliberately not done: no reading of config.json or any other file; tensors
 * present in a shard but absent from the index are kept (HF loaders tolerate
 * them); the index's "metadata" (total_size) is not trusted or checked.
 *
 * defines: struct checkpoint, checkpoint_open(), checkpoint_close(),
 *          checkpoint_find(), checkpoint_count(), checkpoint_tensor_at()
 */
#ifndef MOESERVE_FORMAT_CHECKPOINT_H
#define MOESERVE_FORMAT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "base/strmap.h"
#include "format/safetensors.h"

struct checkpoint {
    char *dir;             /* owned copy of the directory path */
    struct st_file *files; /* (n_files) owned, sorted by file name */
    size_t n_files;
    struct strmap by_name; /* tensor name -> const struct st_tensor * (borrowed from files) */
    uint64_t total_bytes;  /* sum of the mapped files' sizes */
};

/* On failure *c is left zeroed. Prints a progress line (bytes) while mapping. */
enum status checkpoint_open(struct checkpoint *c, const char *dir, struct err *err);
/* Safe on a zeroed struct; leaves *c zeroed. */
void checkpoint_close(struct checkpoint *c);

/* NULL if absent. */
const struct st_tensor *checkpoint_find(const struct checkpoint *c, const char *name);
/* Number of tensors over all files. */
size_t checkpoint_count(const struct checkpoint *c);
/* The i-th tensor, 0 <= i < checkpoint_count(c): files in order, each file's
 * tensors in header order. O(n_files) per call. NULL if i is out of range. */
const struct st_tensor *checkpoint_tensor_at(const struct checkpoint *c, size_t i);

#endif
