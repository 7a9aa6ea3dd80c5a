/* json.c — cJSON behind the json.h API. The only file that includes cJSON.h. */
#include "base/json.h"

#include "base/strmap.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mapped_file.h"

#define C(j) ((const cJSON *)(j))

enum status json_parse(const char *text, size_t len, const char *what, struct json **out,
                       struct err *err)
{
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t off = end && end >= text ? (size_t)(end - text) : 0;
        return err_set(err, STATUS_FORMAT, "%s: malformed JSON near byte %zu", what, off);
    }
    /* one value, then only white space: bytes after it would be what a proxy in front reads
     * differently */
    size_t at = (size_t)(end - text);
    while (at < len && (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r'))
        at++;
    if (at < len) {
        cJSON_Delete(root);
        return err_set(err, STATUS_FORMAT, "%s: bytes after the JSON value, from byte %zu", what, at);
    }
    *out = (struct json *)root;
    return STATUS_OK;
}

enum status json_parse_file(const char *path, struct json **out, struct err *err)
{
    struct mapped_file mf = {0};
    enum status st = mapped_file_open(&mf, path, err);
    if (st)
        return st;
    st = json_parse(mf.size ? (const char *)mf.data : "", mf.size, path, out, err);
    mapped_file_close(&mf);
    return st;
}

const char *json_duplicate_key(const struct json *j)
{
    if (!j)
        return NULL;
    const cJSON *c = C(j);
    size_t n = 0;
    for (const cJSON *a = c->child; a; a = a->next)
        n++;
    if (cJSON_IsObject(c) && n > 1) {
        /* a hash set: a body may hold an object of many thousands of keys */
        struct strmap seen;
        if (!strmap_init(&seen, n))
            return c->child->string; /* out of memory: refuse rather than guess */
        const char *dup = NULL;
        for (const cJSON *a = c->child; a && !dup; a = a->next) {
            void *old = NULL;
            if (!strmap_put(&seen, a->string ? a->string : "", (void *)a, &old))
                dup = a->string;
            else if (old)
                dup = a->string;
        }
        strmap_free(&seen);
        if (dup)
            return dup;
    }
    for (const cJSON *a = c->child; a; a = a->next) {
        const char *d = json_duplicate_key((const struct json *)a);
        if (d)
            return d;
    }
    return NULL;
}

size_t json_count_values(const char *text, size_t len)
{
    size_t n = 1;
    bool in = false;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (in) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in = false;
        } else if (ch == '"') {
            in = true;
        } else if (ch == ',' || ch == '[' || ch == '{') {
            n++;
        }
    }
    return n;
}

bool json_has_nul_escape(const char *text, size_t len)
{
    bool in = false;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (!in) {
            in = ch == '"';
            continue;
        }
        if (ch == '"') {
            in = false;
        } else if (ch == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && i + 5 < len && text[i + 2] == '0' && text[i + 3] == '0' && text[i + 4] == '0' &&
                text[i + 5] == '0')
                return true;
            i++; /* the escaped character */
        }
    }
    return false;
}

void json_free(struct json *j)
{
    cJSON_Delete((cJSON *)j);
}

const struct json *json_get(const struct json *obj, const char *key)
{
    if (!obj || !cJSON_IsObject(C(obj)))
        return NULL;
    return (const struct json *)cJSON_GetObjectItemCaseSensitive(C(obj), key);
}

const struct json *json_child(const struct json *j)
{
    return j ? (const struct json *)C(j)->child : NULL;
}

const struct json *json_next(const struct json *j)
{
    return j ? (const struct json *)C(j)->next : NULL;
}

const char *json_key(const struct json *m)
{
    return m ? C(m)->string : NULL;
}

bool json_is_object(const struct json *j) { return j && cJSON_IsObject(C(j)); }
bool json_is_array(const struct json *j) { return j && cJSON_IsArray(C(j)); }
bool json_is_string(const struct json *j) { return j && cJSON_IsString(C(j)); }
bool json_is_number(const struct json *j) { return j && cJSON_IsNumber(C(j)); }
bool json_is_bool(const struct json *j) { return j && cJSON_IsBool(C(j)); }
bool json_is_null(const struct json *j) { return !j || cJSON_IsNull(C(j)); }

const char *json_string(const struct json *j)
{
    return json_is_string(j) ? C(j)->valuestring : NULL;
}

double json_number(const struct json *j)
{
    return json_is_number(j) ? C(j)->valuedouble : 0.0;
}

bool json_bool(const struct json *j)
{
    return j && cJSON_IsTrue(C(j));
}

size_t json_array_size(const struct json *j)
{
    return json_is_array(j) ? (size_t)cJSON_GetArraySize(C(j)) : 0;
}

const struct json *json_array_at(const struct json *j, size_t i)
{
    return json_is_array(j) ? (const struct json *)cJSON_GetArrayItem(C(j), (int)i) : NULL;
}

struct json *json_new_object(void) { return (struct json *)cJSON_CreateObject(); }
struct json *json_new_array(void) { return (struct json *)cJSON_CreateArray(); }
struct json *json_new_string(const char *s) { return (struct json *)cJSON_CreateString(s); }
struct json *json_new_number(double v) { return (struct json *)cJSON_CreateNumber(v); }
struct json *json_new_bool(bool v) { return (struct json *)cJSON_CreateBool(v); }
struct json *json_new_null(void) { return (struct json *)cJSON_CreateNull(); }

struct json *json_add(struct json *obj, const char *key, struct json *val)
{
    if (!obj || !val || !cJSON_AddItemToObject((cJSON *)obj, key, (cJSON *)val)) {
        cJSON_Delete((cJSON *)val);
        return NULL;
    }
    return val;
}

struct json *json_append(struct json *arr, struct json *val)
{
    if (!arr || !val || !cJSON_AddItemToArray((cJSON *)arr, (cJSON *)val)) {
        cJSON_Delete((cJSON *)val);
        return NULL;
    }
    return val;
}

struct json *json_copy(const struct json *j)
{
    return j ? (struct json *)cJSON_Duplicate(C(j), 1) : json_new_null();
}

char *json_print(const struct json *j, bool pretty)
{
    return pretty ? cJSON_Print(C(j)) : cJSON_PrintUnformatted(C(j));
}
