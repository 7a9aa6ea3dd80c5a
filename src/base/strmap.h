/* strmap.h — string -> pointer hash map (open addressing, keys copied).
 *
 * Used for tensor-name lookup over thousands of names (a GLM-5 checkpoint has
 * ~90k tensors), where a linear JSON walk would be quadratic.
 *
 * defines: struct strmap, strmap_init(), strmap_free(), strmap_put(), strmap_get()
 */
#ifndef MOESERVE_BASE_STRMAP_H
#define MOESERVE_BASE_STRMAP_H

#include <stdbool.h>
#include <stddef.h>

struct strmap_slot {
    char *key; /* owned; NULL = empty */
    void *val; /* borrowed */
};

struct strmap {
    struct strmap_slot *slots; /* (cap) owned */
    size_t cap;                /* power of two */
    size_t len;
};

/* Returns false on OOM. */
bool strmap_init(struct strmap *m, size_t expected);
void strmap_free(struct strmap *m);
/* Inserts or replaces. Returns false on OOM. *old (if non-NULL) receives the
 * previous value or NULL. */
bool strmap_put(struct strmap *m, const char *key, void *val, void **old);
void *strmap_get(const struct strmap *m, const char *key);

#endif
