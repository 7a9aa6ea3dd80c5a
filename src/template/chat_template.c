/* chat_template.c — the public face of the chat-template interpreter: compile
 * (jinja_parser.c), render (jinja_eval.c with the JSON context converted by
 * jinja_json.c), and loading a template from tokenizer_config.json.
 *
 * Not here: anything about the Jinja language itself.
 * Invariant: a struct chat_template is never written after compile, so renders
 * may run concurrently; each render owns all the values it creates.
 */
#include "template/chat_template.h"

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/mapped_file.h"
#include "template/jinja_eval.h"
#include "template/jinja_json.h"
#include "template/jinja_parser.h"

struct chat_template {
    struct jtemplate jt;
    locale_t loc; /* C.UTF-8 for case mapping beyond ASCII, or 0 */
};

enum status chat_template_compile(struct chat_template **out, const char *source, size_t len, struct err *err)
{
    *out = NULL;
    struct chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(err, STATUS_NOMEM, "chat template: out of memory");
    enum status st = jinja_parse(&t->jt, source ? source : "", source ? len : 0, err);
    if (st) {
        free(t);
        return st;
    }
    t->loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    *out = t;
    return STATUS_OK;
}

void chat_template_free(struct chat_template *t)
{
    if (!t)
        return;
    jinja_template_free(&t->jt);
    if (t->loc)
        freelocale(t->loc);
    free(t);
}

static bool template_default(struct jscope *g, const char *name, struct jv v)
{
    if (jscope_lookup(g, name))
        return true;
    return jscope_set(g, name, v);
}

enum status chat_template_render(const struct chat_template *t, const struct json *context, char **out,
                                 size_t *out_len, struct err *err)
{
    *out = NULL;
    *out_len = 0;
    if (context && !json_is_object(context) && !json_is_null(context))
        return err_set(err, STATUS_INVALID, "chat template: the context must be a JSON object");
    struct jscope *globals = jscope_new(NULL);
    if (!globals)
        return err_set(err, STATUS_NOMEM, "chat template: out of memory");
    enum status st = STATUS_OK;
    for (const struct json *m = context ? json_child(context) : NULL; m; m = json_next(m)) {
        const char *key = json_key(m);
        if (!key)
            continue;
        struct jv v;
        st = jinja_json_to_value(m, &v, err);
        if (st)
            goto done;
        if (!jscope_set(globals, key, v)) {
            st = err_set(err, STATUS_NOMEM, "chat template: out of memory");
            goto done;
        }
    }
    if (!template_default(globals, "tools", jv_none()) ||
        !template_default(globals, "documents", jv_none()) ||
        !template_default(globals, "add_generation_prompt", jv_bool(false))) {
        st = err_set(err, STATUS_NOMEM, "chat template: out of memory");
        goto done;
    }
    st = jinja_render(&t->jt, globals, t->loc, out, out_len, err);
done:
    jscope_release(globals);
    return st;
}

/* The content of a special token entry: "..." or {"content": "..."}. */
static const char *config_token(const struct json *v)
{
    if (json_is_string(v))
        return json_string(v);
    if (json_is_object(v))
        return json_string(json_get(v, "content"));
    return NULL;
}

/* Reads <dir of path>/chat_template.jinja if it exists: *out malloc'ed or NULL. */
static enum status config_read_jinja(const char *config_path, char **out, size_t *out_len, struct err *err)
{
    *out = NULL;
    const char *slash = strrchr(config_path, '/');
    size_t dir_len = slash ? (size_t)(slash - config_path) + 1 : 0;
    size_t need = dir_len + sizeof "chat_template.jinja";
    char *path = malloc(need);
    if (!path)
        return err_set(err, STATUS_NOMEM, "out of memory");
    memcpy(path, config_path, dir_len);
    memcpy(path + dir_len, "chat_template.jinja", sizeof "chat_template.jinja");
    struct stat sb;
    if (stat(path, &sb) != 0) { /* absent (a FIFO there is refused by mapped_file_open, never opened blocking) */
        free(path);
        return STATUS_OK;
    }
    struct mapped_file mf = {0};
    struct err e2 = {0};
    enum status st = mapped_file_open(&mf, path, &e2);
    if (st) {
        err_set(err, st, "%s", e2.msg);
        free(path);
        return st;
    }
    *out = malloc(mf.size + 1);
    if (!*out) {
        mapped_file_close(&mf);
        free(path);
        return err_set(err, STATUS_NOMEM, "out of memory");
    }
    if (mf.size)
        memcpy(*out, mf.data, mf.size);
    (*out)[mf.size] = '\0';
    *out_len = mf.size;
    mapped_file_close(&mf);
    free(path);
    return STATUS_OK;
}

enum status chat_template_from_config(struct chat_template **out, const char *tokenizer_config_json_path,
                                      struct json **special_vars, struct err *err)
{
    *out = NULL;
    if (special_vars)
        *special_vars = NULL;
    const char *path = tokenizer_config_json_path;
    struct json *cfg = NULL;
    enum status st = json_parse_file(path, &cfg, err);
    if (st)
        return st;
    char *jinja = NULL;
    size_t jinja_len = 0;
    st = config_read_jinja(path, &jinja, &jinja_len, err);
    if (st)
        goto done;
    if (jinja) {
        st = chat_template_compile(out, jinja, jinja_len, err);
        if (st)
            err_prefix(err, "%s/../chat_template.jinja", path);
    } else {
        const struct json *ct = json_get(cfg, "chat_template");
        const char *src = NULL;
        if (json_is_string(ct)) {
            src = json_string(ct);
        } else if (json_is_array(ct)) {
            for (const struct json *e = json_child(ct); e; e = json_next(e)) {
                const char *name = json_string(json_get(e, "name"));
                if (name && !strcmp(name, "default")) {
                    src = json_string(json_get(e, "template"));
                    break;
                }
            }
            if (!src) {
                st = err_set(err, STATUS_NOT_FOUND, "%s: chat_template: no template named \"default\"", path);
                goto done;
            }
        } else {
            st = err_set(err, STATUS_NOT_FOUND, "%s: no chat_template", path);
            goto done;
        }
        if (!src) {
            st = err_set(err, STATUS_FORMAT, "%s: chat_template: not a string", path);
            goto done;
        }
        st = chat_template_compile(out, src, strlen(src), err);
        if (st)
            err_prefix(err, "%s", path);
    }
    if (st || !special_vars)
        goto done;
    struct json *vars = json_new_object();
    if (!vars) {
        st = err_set(err, STATUS_NOMEM, "out of memory");
        goto done;
    }
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *tok = config_token(json_get(cfg, names[i]));
        if (!tok)
            continue;
        struct json *s = json_new_string(tok);
        if (!s || !json_add(vars, names[i], s)) {
            json_free(vars);
            st = err_set(err, STATUS_NOMEM, "out of memory");
            goto done;
        }
    }
    *special_vars = vars;
done:
    if (st) {
        chat_template_free(*out);
        *out = NULL;
    }
    free(jinja);
    json_free(cfg);
    return st;
}
