/* quant_config.c — see quant_config.h. */
#include "format/quant_config.h"

#include <fnmatch.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *quant_algo_name(enum quant_algo a)
{
    switch (a) {
    case QUANT_NONE: return "none";
    case QUANT_NVFP4: return "NVFP4";
    case QUANT_W4A16_NVFP4: return "W4A16_NVFP4";
    case QUANT_FP8_BLOCK: return "FP8 block 128x128";
    case QUANT_MIXED: return "MIXED_PRECISION";
    case QUANT_CT_NVFP4: return "compressed-tensors nvfp4-pack-quantized";
    }
    return "?";
}

static bool algo_parse(const char *s, enum quant_algo *out)
{
    if (!s)
        return false;
    if (!strcmp(s, "NVFP4"))
        *out = QUANT_NVFP4;
    else if (!strcmp(s, "W4A16_NVFP4"))
        *out = QUANT_W4A16_NVFP4;
    else if (!strcmp(s, "FP8") || !strcmp(s, "FP8_PB_WO") || !strcmp(s, "fp8_pb_wo"))
        *out = QUANT_FP8_BLOCK;
    else if (!strcmp(s, "MIXED_PRECISION"))
        *out = QUANT_MIXED;
    else
        return false;
    return true;
}

static enum status add_patterns(struct quant_config *q, const struct json *list, const char *what, const char *key,
                                struct err *err)
{
    if (json_is_null(list))
        return STATUS_OK;
    if (!json_is_array(list))
        return err_set(err, STATUS_FORMAT, "%s: \"%s\" is not a list of module patterns", what, key);
    size_t n = json_array_size(list);
    char **grown = realloc(q->exclude, (q->n_exclude + n) * sizeof *grown);
    if (!grown && n)
        return err_set(err, STATUS_NOMEM, "%s: out of memory", what);
    q->exclude = grown;
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string(json_array_at(list, i));
        if (!s)
            return err_set(err, STATUS_FORMAT, "%s: \"%s\"[%zu] is not a string", what, key, i);
        q->exclude[q->n_exclude] = strdup(s);
        if (!q->exclude[q->n_exclude])
            return err_set(err, STATUS_NOMEM, "%s: out of memory", what);
        q->n_exclude++;
    }
    return STATUS_OK;
}

static enum status parse_mixed(struct quant_config *q, const struct json *layers, const char *what, struct err *err)
{
    if (!json_is_object(layers))
        return err_set(err, STATUS_FORMAT, "%s: MIXED_PRECISION needs a \"quantized_layers\" object", what);
    if (!strmap_init(&q->mixed, 64))
        return err_set(err, STATUS_NOMEM, "%s: out of memory", what);
    for (const struct json *m = json_child(layers); m; m = json_next(m)) {
        enum quant_algo a;
        if (!algo_parse(json_string(json_get(m, "quant_algo")), &a) || a == QUANT_MIXED)
            return err_set(err, STATUS_UNSUPPORTED, "%s: quantized_layers.%s: quant_algo is not NVFP4, "
                           "W4A16_NVFP4 or FP8", what, json_key(m));
        if (!strmap_put(&q->mixed, json_key(m), (void *)(intptr_t)a, NULL))
            return err_set(err, STATUS_NOMEM, "%s: out of memory", what);
    }
    return STATUS_OK;
}

enum status quant_config_parse(struct quant_config *q, const struct json *obj, bool hf_quant, const char *what,
                               struct err *err)
{
    const struct json *sec = hf_quant ? json_get(obj, "quantization") : json_get(obj, "quantization_config");
    if (json_is_null(sec))
        return STATUS_OK;
    if (!json_is_object(sec))
        return err_set(err, STATUS_FORMAT, "%s: the quantization section is not an object", what);
    snprintf(q->source, sizeof q->source, "%s", strrchr(what, '/') ? strrchr(what, '/') + 1 : what);
    const char *method = json_string(json_get(sec, "quant_method"));
    const char *algo = json_string(json_get(sec, "quant_algo"));
    enum status st;
    if (method && !strcmp(method, "compressed-tensors")) {
        const char *fmt = json_string(json_get(sec, "format"));
        const struct json *groups = json_get(sec, "config_groups");
        for (const struct json *g = json_child(groups); g && !fmt; g = json_next(g))
            fmt = json_string(json_get(g, "format"));
        if (!fmt || strcmp(fmt, "nvfp4-pack-quantized") != 0)
            return err_set(err, STATUS_UNSUPPORTED, "%s: compressed-tensors format \"%s\" is not supported "
                           "(nvfp4-pack-quantized is)", what, fmt ? fmt : "(none)");
        q->algo = QUANT_CT_NVFP4;
        q->group_size = 16;
        return add_patterns(q, json_get(sec, "ignore"), what, "ignore", err);
    }
    if (method && !strcmp(method, "fp8")) {
        const struct json *bs = json_get(sec, "weight_block_size");
        if (json_array_size(bs) != 2)
            return err_set(err, STATUS_UNSUPPORTED, "%s: fp8 without weight_block_size [128, 128] "
                           "(per-tensor FP8) is not supported", what);
        q->block_n = (int)json_number(json_array_at(bs, 0));
        q->block_k = (int)json_number(json_array_at(bs, 1));
        if (q->block_n != 128 || q->block_k != 128)
            return err_set(err, STATUS_UNSUPPORTED, "%s: weight_block_size [%d, %d]: only [128, 128] is supported",
                           what, q->block_n, q->block_k);
        q->algo = QUANT_FP8_BLOCK;
        st = add_patterns(q, json_get(sec, "modules_to_not_convert"), what, "modules_to_not_convert", err);
        return st ? st : add_patterns(q, json_get(sec, "ignore"), what, "ignore", err);
    }
    if (!algo_parse(algo, &q->algo))
        return err_set(err, STATUS_UNSUPPORTED, "%s: quant_algo \"%s\" (quant_method \"%s\") is not supported",
                       what, algo ? algo : "(none)", method ? method : "(none)");
    q->group_size = (int)json_number(json_get(sec, "group_size"));
    if (!q->group_size)
        q->group_size = 16;
    if (q->algo != QUANT_FP8_BLOCK && q->group_size != 16)
        return err_set(err, STATUS_UNSUPPORTED, "%s: NVFP4 group_size %d (only 16 exists)", what, q->group_size);
    if (q->algo == QUANT_FP8_BLOCK)
        q->block_n = q->block_k = 128;
    if (q->algo == QUANT_MIXED && (st = parse_mixed(q, json_get(sec, "quantized_layers"), what, err)))
        return st;
    st = add_patterns(q, json_get(sec, hf_quant ? "exclude_modules" : "ignore"), what,
                      hf_quant ? "exclude_modules" : "ignore", err);
    return st;
}

enum status quant_config_load(struct quant_config *q, const char *dir, struct err *err)
{
    memset(q, 0, sizeof *q);
    char path[4096];
    struct json *j = NULL;
    struct err ignored = {0};
    enum status st;
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    if (json_parse_file(path, &j, &ignored) == STATUS_OK) {
        st = quant_config_parse(q, j, true, path, err);
        json_free(j);
        if (st || q->algo != QUANT_NONE) {
            if (st)
                quant_config_free(q);
            return st;
        }
    } else if (ignored.code != STATUS_IO) {
        return err_set(err, ignored.code, "%s", ignored.msg); /* present but malformed */
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    st = json_parse_file(path, &j, err);
    if (st)
        return st;
    st = quant_config_parse(q, j, false, path, err);
    json_free(j);
    if (st)
        quant_config_free(q);
    return st;
}

void quant_config_free(struct quant_config *q)
{
    for (size_t i = 0; i < q->n_exclude; i++)
        free(q->exclude[i]);
    free(q->exclude);
    if (q->mixed.cap)
        strmap_free(&q->mixed);
    memset(q, 0, sizeof *q);
}

/* "mlp.gate" matches "model.layers.3.mlp.gate" but not "...mlp.gate_proj". */
static bool match_component_substring(const char *pattern, const char *module)
{
    size_t lp = strlen(pattern);
    for (const char *p = strstr(module, pattern); p; p = strstr(p + 1, pattern)) {
        bool start_ok = p == module || p[-1] == '.';
        bool end_ok = p[lp] == 0 || p[lp] == '.';
        if (start_ok && end_ok)
            return true;
    }
    return false;
}

bool quant_config_excluded(const struct quant_config *q, const char *module)
{
    for (size_t i = 0; i < q->n_exclude; i++) {
        const char *p = q->exclude[i];
        if (fnmatch(p, module, 0) == 0)
            return true;
        if (!strpbrk(p, "*?[") && match_component_substring(p, module))
            return true;
    }
    return false;
}

static enum weight_format algo_format(enum quant_algo a)
{
    switch (a) {
    case QUANT_NVFP4:
    case QUANT_W4A16_NVFP4:
    case QUANT_CT_NVFP4: return WEIGHT_NVFP4;
    case QUANT_FP8_BLOCK: return WEIGHT_FP8_BLOCK;
    default: return WEIGHT_BF16;
    }
}

enum weight_format quant_config_expect(const struct quant_config *q, const char *module)
{
    if (q->algo == QUANT_NONE || quant_config_excluded(q, module))
        return WEIGHT_BF16;
    if (q->algo == QUANT_MIXED) {
        void *v = strmap_get(&q->mixed, module);
        return v ? algo_format((enum quant_algo)(intptr_t)v) : WEIGHT_BF16;
    }
    return algo_format(q->algo);
}
