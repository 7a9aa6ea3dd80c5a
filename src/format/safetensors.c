/* safetensors.c — parse and validate a safetensors header (see safetensors.h).
 *
 * Order of checks: the 8-byte length prefix, the header bounds, JSON
 * well-formedness, then each entry on its own (dtype, shape, offsets, byte
 * count), then the cross-entry checks (duplicate names, overlaps) on sorted
 * index arrays. Numbers arrive as doubles from the JSON layer, so every
 * integer is checked to be integral, non-negative and <= 2^53 (exact) before
 * it is converted; every product is overflow-checked.
 *
 * Invariant: nothing in *f is published until the whole header validated, so
 * a caller never sees a half-checked tensor.
 */
#include "format/safetensors.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest double below which every integer is exactly representable. */
#define ST_MAX_EXACT_INT 9007199254740992.0 /* 2^53 */

/* Parsing context: the file's name for messages and the data section bounds. */
struct st_parse {
    const char *name;
    const unsigned char *data; /* start of the data section */
    uint64_t data_size;
};

static uint64_t st_read_u64_le(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* JSON numbers are doubles: accept only integral values in [0, 2^53]. Rejects
 * 1.5, -1, 1e30 and infinities. -0 reads as 0. */
static bool st_json_to_u64(const struct json *j, uint64_t *out)
{
    if (!json_is_number(j))
        return false;
    double d = json_number(j);
    if (!(d >= 0.0 && d <= ST_MAX_EXACT_INT)) /* also false for NaN */
        return false;
    uint64_t v = (uint64_t)d;
    if ((double)v != d)
        return false;
    *out = v;
    return true;
}

/* cJSON stops after the first value and ignores what follows; the reference
 * reader (serde_json) allows only whitespace there (the padding to 8 bytes).
 * Runs after a successful parse, so brackets balance outside strings. */
static bool st_header_tail_is_space(const char *text, size_t len)
{
    size_t i = 0, depth = 0;
    bool in_str = false;
    for (; i < len; i++) {
        char ch = text[i];
        if (in_str) {
            if (ch == '\\')
                i++; /* the escaped character cannot end the string */
            else if (ch == '"')
                in_str = false;
        } else if (ch == '"') {
            in_str = true;
        } else if (ch == '{' || ch == '[') {
            depth++;
        } else if ((ch == '}' || ch == ']') && depth > 0 && --depth == 0) {
            i++;
            break;
        }
    }
    for (; i < len; i++)
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\n' && text[i] != '\r')
            return false;
    return true;
}

static void st_tensors_free(struct st_tensor *ts, size_t n)
{
    if (!ts)
        return;
    for (size_t i = 0; i < n; i++)
        free(ts[i].name);
    free(ts);
}

/* Copies __metadata__ into a fresh object: the parsed header tree is freed
 * after parsing, and cJSON has no cheap "detach" through our wrapper. */
static enum status st_parse_metadata(const struct st_parse *p, const struct json *meta,
                                     struct json **out, struct err *err)
{
    if (!json_is_object(meta))
        return err_set(err, STATUS_FORMAT, "%s: __metadata__ is not an object", p->name);
    struct json *copy = json_new_object();
    if (!copy)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", p->name);
    for (const struct json *m = json_child(meta); m; m = json_next(m)) {
        const char *val = json_string(m);
        if (!val) {
            json_free(copy);
            return err_set(err, STATUS_FORMAT, "%s: __metadata__ value of \"%s\" is not a string",
                           p->name, json_key(m));
        }
        if (!json_add(copy, json_key(m), json_new_string(val))) {
            json_free(copy);
            return err_set(err, STATUS_NOMEM, "%s: out of memory", p->name);
        }
    }
    *out = copy;
    return STATUS_OK;
}

/* Validates one header entry and fills *t (except name and file). */
static enum status st_parse_entry(const struct st_parse *p, const char *tname,
                                  const struct json *e, struct st_tensor *t, struct err *err)
{
    if (!json_is_object(e))
        return err_set(err, STATUS_FORMAT, "%s: tensor %s: entry is not an object", p->name,
                       tname);

    /* dtype */
    const struct json *jd = json_get(e, "dtype");
    if (!jd)
        return err_set(err, STATUS_FORMAT, "%s: tensor %s: missing \"dtype\"", p->name, tname);
    const char *ds = json_string(jd);
    if (!ds)
        return err_set(err, STATUS_FORMAT, "%s: tensor %s: \"dtype\" is not a string", p->name,
                       tname);
    if (!dtype_parse(ds, &t->dtype))
        return err_set(err, STATUS_UNSUPPORTED, "%s: tensor %s: unsupported dtype \"%s\"",
                       p->name, tname, ds);

    /* shape */
    const struct json *js = json_get(e, "shape");
    if (!js)
        return err_set(err, STATUS_FORMAT, "%s: tensor %s: missing \"shape\"", p->name, tname);
    if (!json_is_array(js))
        return err_set(err, STATUS_FORMAT, "%s: tensor %s: \"shape\" is not an array", p->name,
                       tname);
    uint64_t numel = 1;
    bool has_zero = false, overflow = false;
    int n = 0;
    /* child/next rather than json_array_at: the latter is O(i) per call. */
    for (const struct json *d = json_child(js); d; d = json_next(d), n++) {
        if (n == ST_MAX_DIMS)
            return err_set(err, STATUS_FORMAT, "%s: tensor %s: shape has more than %d dimensions",
                           p->name, tname, ST_MAX_DIMS);
        uint64_t v;
        if (!st_json_to_u64(d, &v))
            return err_set(err, STATUS_FORMAT,
                           "%s: tensor %s: shape[%d] is not a non-negative integer", p->name,
                           tname, n);
        t->shape[n] = (int64_t)v;
        /* A zero anywhere makes the product 0 even if a prefix overflowed. */
        if (v == 0)
            has_zero = true;
        else if (!overflow && __builtin_mul_overflow(numel, v, &numel))
            overflow = true;
    }
    t->n_dims = n;
    if (has_zero)
        numel = 0;
    else if (overflow)
        return err_set(err, STATUS_FORMAT, "%s: tensor %s: shape element count overflows",
                       p->name, tname);

    /* data_offsets */
    const struct json *jo = json_get(e, "data_offsets");
    if (!jo)
        return err_set(err, STATUS_FORMAT, "%s: tensor %s: missing \"data_offsets\"", p->name,
                       tname);
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return err_set(err, STATUS_FORMAT,
                       "%s: tensor %s: \"data_offsets\" is not an array of two integers", p->name,
                       tname);
    uint64_t begin, end;
    if (!st_json_to_u64(json_child(jo), &begin) ||
        !st_json_to_u64(json_next(json_child(jo)), &end))
        return err_set(err, STATUS_FORMAT,
                       "%s: tensor %s: data_offsets are not non-negative integers", p->name, tname);
    if (begin > end)
        return err_set(err, STATUS_FORMAT,
                       "%s: tensor %s: data_offsets [%llu,%llu] out of range (begin > end)", p->name, tname,
                       (unsigned long long)begin, (unsigned long long)end);
    if (end > p->data_size)
        return err_set(err, STATUS_FORMAT,
                       "%s: tensor %s: data_offsets [%llu,%llu] out of range (data section is "
                       "%llu bytes)",
                       p->name, tname, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)p->data_size);

    uint64_t n_bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)dtype_size(t->dtype), &n_bytes))
        return err_set(err, STATUS_FORMAT, "%s: tensor %s: shape byte count overflows", p->name,
                       tname);
    if (n_bytes != end - begin)
        return err_set(err, STATUS_FORMAT,
                       "%s: tensor %s: shape and dtype %s need %llu bytes but data_offsets "
                       "[%llu,%llu] hold %llu",
                       p->name, tname, dtype_name(t->dtype), (unsigned long long)n_bytes,
                       (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin));

    t->data = p->data + begin; /* in bounds: end <= data_size */
    t->n_bytes = (size_t)n_bytes;
    return STATUS_OK;
}

static int st_cmp_name(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a;
    const struct st_tensor *y = *(const struct st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static int st_cmp_offset(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a;
    const struct st_tensor *y = *(const struct st_tensor *const *)b;
    const char *xa = x->data, *ya = y->data; /* both point into the same data section */
    if (xa != ya)
        return xa < ya ? -1 : 1;
    return (x->n_bytes > y->n_bytes) - (x->n_bytes < y->n_bytes);
}

/* Duplicate names and overlapping byte ranges, via sorted pointer arrays
 * (O(n log n); GLM-5 shards hold thousands of tensors). */
static enum status st_check_cross(const struct st_parse *p, const struct st_tensor *ts, size_t n,
                                  struct err *err)
{
    if (n < 2)
        return STATUS_OK;
    const struct st_tensor **idx = malloc(n * sizeof *idx);
    if (!idx)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", p->name);
    for (size_t i = 0; i < n; i++)
        idx[i] = &ts[i];

    enum status st = STATUS_OK;
    qsort(idx, n, sizeof *idx, st_cmp_name);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(idx[i - 1]->name, idx[i]->name) == 0) {
            st = err_set(err, STATUS_FORMAT, "%s: tensor %s: duplicate name in header", p->name,
                         idx[i]->name);
            goto out;
        }
    }

    /* Empty tensors own no bytes, so they cannot overlap anything. */
    qsort(idx, n, sizeof *idx, st_cmp_offset);
    const struct st_tensor *last = NULL; /* the non-empty tensor reaching furthest so far */
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = idx[i];
        if (t->n_bytes == 0)
            continue;
        const char *tb = t->data;
        if (last && tb < (const char *)last->data + last->n_bytes) {
            const unsigned char *lb = last->data;
            unsigned long long l0 = (unsigned long long)(lb - p->data);
            unsigned long long t0 = (unsigned long long)((const unsigned char *)tb - p->data);
            st = err_set(err, STATUS_FORMAT,
                         "%s: tensor %s: data_offsets [%llu,%llu] overlap tensor %s [%llu,%llu]",
                         p->name, t->name, t0, t0 + t->n_bytes, last->name, l0,
                         l0 + last->n_bytes);
            goto out;
        }
        if (!last || tb + t->n_bytes > (const char *)last->data + last->n_bytes)
            last = t;
    }
out:
    free(idx);
    return st;
}

/* Parses the header text into *root_out; it must be a JSON object followed by
 * nothing but whitespace; on failure *root_out is left untouched. */
static enum status st_parse_header_json(const unsigned char *hdr, uint64_t hlen, const char *name,
                                        struct json **root_out, struct err *err)
{
    /* A NUL-terminated private copy: the JSON parser then cannot read past the
     * header into tensor bytes, whatever its own bounds handling. */
    char *text = malloc((size_t)hlen + 1);
    if (!text)
        return err_set(err, STATUS_NOMEM, "%s: out of memory for a %llu-byte header", name,
                       (unsigned long long)hlen);
    memcpy(text, hdr, (size_t)hlen);
    text[hlen] = '\0';
    char what[ERR_MSG_MAX];
    snprintf(what, sizeof what, "%s: header", name);
    struct json *root = NULL;
    enum status st = json_parse(text, (size_t)hlen, what, &root, err);
    bool tail_ok = st == STATUS_OK && st_header_tail_is_space(text, (size_t)hlen);
    free(text);
    if (st)
        return st;
    if (!tail_ok) {
        json_free(root);
        return err_set(err, STATUS_FORMAT, "%s: header has trailing bytes after the JSON value",
                       name);
    }
    if (!json_is_object(root)) {
        json_free(root);
        return err_set(err, STATUS_FORMAT, "%s: header is not a JSON object", name);
    }
    *root_out = root;
    return STATUS_OK;
}

enum status st_parse_buffer(struct st_file *f, const void *buf, size_t size, const char *name,
                            struct err *err)
{
    f->tensors = NULL;
    f->n_tensors = 0;
    f->metadata = NULL;

    const unsigned char *b = buf;
    if (size < 8)
        return err_set(err, STATUS_FORMAT,
                       "%s: file is %zu bytes, too short for the 8-byte header length", name, size);
    uint64_t hlen = st_read_u64_le(b);
    if (hlen > ST_MAX_HEADER_BYTES)
        return err_set(err, STATUS_FORMAT, "%s: header length %llu exceeds the %llu-byte limit",
                       name, (unsigned long long)hlen, ST_MAX_HEADER_BYTES);
    if (hlen > size - 8)
        return err_set(err, STATUS_FORMAT,
                       "%s: header length %llu runs past the end of the file (%zu bytes)", name,
                       (unsigned long long)hlen, size);

    struct st_parse p = {
        .name = name,
        .data = b + 8 + hlen,
        .data_size = (uint64_t)(size - 8 - hlen),
    };

    struct json *root = NULL;
    enum status st = st_parse_header_json(b + 8, hlen, name, &root, err);
    if (st)
        return st;

    size_t n_members = 0;
    for (const struct json *m = json_child(root); m; m = json_next(m))
        n_members++;
    struct st_tensor *ts = calloc(n_members ? n_members : 1, sizeof *ts);
    if (!ts) {
        json_free(root);
        return err_set(err, STATUS_NOMEM, "%s: out of memory", name);
    }

    size_t n = 0;
    struct json *meta = NULL;
    bool seen_meta = false;
    for (const struct json *m = json_child(root); m; m = json_next(m)) {
        const char *key = json_key(m);
        if (strcmp(key, "__metadata__") == 0) {
            if (seen_meta) {
                st = err_set(err, STATUS_FORMAT, "%s: __metadata__ appears twice", name);
                goto fail;
            }
            seen_meta = true;
            st = st_parse_metadata(&p, m, &meta, err);
            if (st)
                goto fail;
            continue;
        }
        struct st_tensor *t = &ts[n];
        st = st_parse_entry(&p, key, m, t, err);
        if (st)
            goto fail;
        t->name = strdup(key);
        if (!t->name) {
            st = err_set(err, STATUS_NOMEM, "%s: out of memory", name);
            goto fail;
        }
        t->file = name;
        n++;
    }

    st = st_check_cross(&p, ts, n, err);
    if (st)
        goto fail;

    json_free(root);
    f->tensors = ts;
    f->n_tensors = n;
    f->metadata = meta;
    return STATUS_OK;

fail:
    json_free(root);
    json_free(meta);
    st_tensors_free(ts, n_members); /* calloc'ed: unused names are NULL */
    return st;
}

enum status st_file_open(struct st_file *f, const char *path, struct err *err)
{
    memset(f, 0, sizeof *f);
    enum status st = mapped_file_open(&f->map, path, err);
    if (st)
        return st;
    /* map.path, not path: the tensors' `file` must live as long as *f. */
    st = st_parse_buffer(f, f->map.data, f->map.size, f->map.path, err);
    if (st)
        st_file_close(f);
    return st;
}

void st_file_close(struct st_file *f)
{
    st_tensors_free(f->tensors, f->n_tensors);
    json_free(f->metadata);
    mapped_file_close(&f->map);
    memset(f, 0, sizeof *f);
}

const struct st_tensor *st_file_find(const struct st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

int64_t st_tensor_numel(const struct st_tensor *t)
{
    /* Validated at parse time: the product fits (it times dtype_size is the
     * byte count), but only when no dimension is 0, so test for 0 first. */
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++)
        if (t->shape[i] == 0)
            return 0;
    for (int i = 0; i < t->n_dims; i++)
        n *= t->shape[i];
    return n;
}
