/* safetensors_header.c — see safetensors_header.h. */
#include "format/safetensors_header.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"

char *st_header_build(size_t n, st_header_entry_fn entry, const void *ctx, size_t *len)
{
    struct json *h = json_new_object();
    struct json *meta = json_add(h, "__metadata__", json_new_object());
    json_add(meta, "format", json_new_string("pt"));
    for (size_t i = 0; i < n; i++) {
        struct st_header_entry t;
        entry(ctx, i, &t);
        struct json *e = json_add(h, t.name, json_new_object());
        json_add(e, "dtype", json_new_string(dtype_name(t.dtype)));
        struct json *shape = json_add(e, "shape", json_new_array());
        for (int d = 0; d < t.n_dims; d++)
            json_append(shape, json_new_number((double)t.shape[d]));
        struct json *off = json_add(e, "data_offsets", json_new_array());
        json_append(off, json_new_number((double)t.begin));
        json_append(off, json_new_number((double)t.end));
    }
    char *s = json_print(h, false);
    json_free(h);
    if (!s)
        return NULL;
    size_t used = strlen(s), padded = (used + 7) / 8 * 8;
    char *p = realloc(s, padded + 1);
    if (!p) {
        free(s);
        return NULL;
    }
    memset(p + used, ' ', padded - used);
    p[padded] = 0;
    *len = padded;
    return p;
}
