/* kernel_desc.c — see kernel_desc.h. */
#include "plan/kernel_desc.h"

#include <string.h>

const struct kernel_desc *kernel_table_find(const struct kernel_table *t, const char *name)
{
    for (int i = 0; t && name && i < t->n; i++)
        if (strcmp(t->kernels[i].name, name) == 0)
            return &t->kernels[i];
    return NULL;
}

bool kernel_desc_serves(const struct kernel_desc *k, const char *op)
{
    size_t n = strlen(op);
    for (const char *p = k->op; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, op, n) == 0)
            return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}
