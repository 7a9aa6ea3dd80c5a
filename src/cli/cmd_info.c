/* cmd_info.c — `moeserve info`: what a checkpoint is and what it will cost.
 *
 * Reads config.json and binds the weights on the CPU backend (mmap only, no
 * compute), so the report reflects exactly what a run would load. KV figures
 * are what engine/kv_cache.c allocates per token: K and V for GQA layers; for
 * MLA layers the latent row plus, on layers with their own DSA indexer, the
 * indexer key (never the expanded per-head K/V, shown only for comparison).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "engine/kv_cache.h"
#include "base/log.h"
#include "base/options.h"
#include "cli/cli_args.h"
#include "cli/commands.h"
#include "format/checkpoint.h"
#include "model/model_desc.h"
#include "model/model_weights.h"

const char *cli_default_model(void)
{
    struct options o;
    struct err err;
    if (options_read(&o, &err) == STATUS_OK && o.model)
        return o.model;
    return MOESERVE_DEFAULT_MODEL;
}

const char *cli_env_api_key(void)
{
    struct options o;
    struct err err;
    return options_read(&o, &err) == STATUS_OK ? o.api_key : NULL;
}

/* "bf16+nvfp4" from a bit set of formats. */
static void info_format_list(unsigned formats, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++)
        if (formats & (1u << f))
            o += (size_t)snprintf(buf + o, o < n ? n - o : 0, "%s%s", o ? "+" : "",
                                  weight_format_name((enum weight_format)f));
}

/* MLA cache rows per token and layer, in values: the latent row (c_kv + rope key), the
 * indexer key on layers that own one, and, for comparison, the expanded per-head K/V
 * that transformers caches (spec C.8). */
struct info_kv_mla {
    bool on;
    uint64_t latent, index, expanded;
    int full_layers;
};

static void info_kv_mla(const struct model_desc *d, struct info_kv_mla *m)
{
    memset(m, 0, sizeof *m);
    for (int l = 0; l < d->n_layers; l++) {
        m->on |= d->layers[l].attn == ATTN_MLA;
        m->full_layers += d->layers[l].indexer == INDEXER_FULL;
    }
    if (!m->on)
        return;
    m->latent = (uint64_t)d->kv_lora_rank + (uint64_t)d->qk_rope_head_dim;
    m->index = m->full_layers ? (uint64_t)d->index_head_dim : 0;
    m->expanded = (uint64_t)d->n_heads * ((uint64_t)d->qk_nope_head_dim + (uint64_t)d->qk_rope_head_dim +
                                          (uint64_t)d->v_head_dim);
}

static const char *attn_name(enum attn_kind a)
{
    return a == ATTN_MLA ? "mla" : "gqa";
}

/* Everything the report prints, gathered once for either format. */
struct info_report {
    const char *dir;
    const struct model_desc *d;
    const struct model_weights *w;
    const struct quant_config *qc;
    const struct checkpoint *ck;
    int n_moe;
    uint64_t weight_bytes;
    enum kv_dtype latent_dtype;   /* MLA layers' rows (--kv-cache-dtype); GQA layers are f32 */
    uint64_t kv_token, kv_layer0; /* bytes engine/kv_cache.c allocates */
    struct info_kv_mla mla;
};

static void info_collect_report(struct info_report *r, const char *dir, const struct model_desc *d,
                                const struct model_weights *w, const struct quant_config *qc,
                                const struct checkpoint *ck, enum kv_dtype latent)
{
    *r = (struct info_report){.dir = dir, .d = d, .w = w, .qc = qc, .ck = ck, .latent_dtype = latent};
    for (int l = 0; l < d->n_layers; l++)
        r->n_moe += d->layers[l].ffn == FFN_MOE;
    for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++)
        r->weight_bytes += w->bytes_by_format[f];
    r->kv_token = kv_cache_bytes(d, latent, 1, 1);
    r->kv_layer0 = kv_cache_layer_bytes(d, 0, latent);
    info_kv_mla(d, &r->mla);
}

/* The per-module table: format, parameters, bytes. */
static void info_add_json_modules(struct json *o, const struct model_weights *w)
{
    struct json *mk = json_add(o, "modules", json_new_object());
    for (int k = 0; k < WK_COUNT; k++) {
        if (!w->kinds[k].params)
            continue;
        struct json *e = json_add(mk, weight_kind_name((enum weight_kind)k), json_new_object());
        char fmts[96];
        info_format_list(w->kinds[k].formats, fmts, sizeof fmts);
        json_add(e, "format", json_new_string(fmts));
        json_add(e, "parameters", json_new_number((double)w->kinds[k].params));
        json_add(e, "bytes", json_new_number((double)w->kinds[k].bytes));
        json_add(e, "bits_per_weight", json_new_number(8.0 * (double)w->kinds[k].bytes / (double)w->kinds[k].params));
    }
}

static void info_print_json(const struct info_report *r)
{
    const struct model_desc *d = r->d;
    const struct model_weights *w = r->w;
    struct json *o = json_new_object();
    json_add(o, "model", json_new_string(r->dir));
    json_add(o, "family", json_new_string(model_family_name(d->family)));
    json_add(o, "layers", json_new_number(d->n_layers));
    json_add(o, "moe_layers", json_new_number(r->n_moe));
    json_add(o, "hidden_size", json_new_number(d->d_model));
    json_add(o, "vocab_size", json_new_number(d->vocab_size));
    json_add(o, "attention", json_new_string(attn_name(d->layers[0].attn)));
    json_add(o, "experts", json_new_number(d->n_experts));
    json_add(o, "experts_per_token", json_new_number(d->n_experts_used));
    json_add(o, "parameters", json_new_number((double)w->n_params));
    struct json *bf = json_add(o, "bytes_by_format", json_new_object());
    for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++)
        if (w->bytes_by_format[f])
            json_add(bf, weight_format_name((enum weight_format)f), json_new_number((double)w->bytes_by_format[f]));
    json_add(o, "weight_bytes", json_new_number((double)r->weight_bytes));
    json_add(o, "quantization", json_new_string(quant_algo_name(r->qc->algo)));
    info_add_json_modules(o, w);
    json_add(o, "kv_dtype", json_new_string(r->mla.on ? kv_dtype_name(r->latent_dtype) : "f32"));
    json_add(o, "kv_bytes_per_token_layer0", json_new_number((double)r->kv_layer0));
    json_add(o, "kv_bytes_per_token", json_new_number((double)r->kv_token));
    if (r->mla.on) {
        struct json *k = json_add(o, "kv_mla", json_new_object());
        json_add(k, "latent_values_per_token_layer", json_new_number((double)r->mla.latent));
        json_add(k, "indexer_values_per_token_layer", json_new_number((double)r->mla.index));
        json_add(k, "indexer_layers", json_new_number(r->mla.full_layers));
        json_add(k, "expanded_kv_values_per_token_layer", json_new_number((double)r->mla.expanded));
    }
    char *s = json_print(o, true);
    printf("%s\n", s);
    free(s);
    json_free(o);
}

static void info_print_table(const struct info_report *r)
{
    const struct model_desc *d = r->d;
    const struct model_weights *w = r->w;
    printf("model          %s\n", r->dir);
    printf("family         %s\n", model_family_name(d->family));
    printf("layers         %d (%d MoE, %d dense), attention %s\n", d->n_layers, r->n_moe, d->n_layers - r->n_moe,
           attn_name(d->layers[0].attn));
    printf("hidden         %d, heads %d (kv %d, head_dim %d), vocab %d\n", d->d_model, d->n_heads, d->n_kv_heads,
           d->head_dim, d->vocab_size);
    if (d->n_experts)
        printf("experts        %d routed (top %d, width %d), %d shared, router %s\n", d->n_experts,
               d->n_experts_used, d->d_expert, d->n_shared_experts,
               d->router == ROUTER_SOFTMAX ? "softmax" : "sigmoid+bias");
    printf("parameters     %.3f M\n", (double)w->n_params / 1e6);
    for (int f = 0; f < WEIGHT_FORMAT_COUNT; f++)
        if (w->bytes_by_format[f])
            printf("  %-12s %.2f MiB\n", weight_format_name((enum weight_format)f),
                   (double)w->bytes_by_format[f] / 1048576.0);
    printf("quantization   %s\n", quant_algo_name(r->qc->algo));
    for (int k = 0; k < WK_COUNT; k++) {
        if (!w->kinds[k].params)
            continue;
        char fmts[96];
        info_format_list(w->kinds[k].formats, fmts, sizeof fmts);
        printf("  %-15s %-22s %10.3f M params  %6.2f bits/weight\n", weight_kind_name((enum weight_kind)k), fmts,
               (double)w->kinds[k].params / 1e6, 8.0 * (double)w->kinds[k].bytes / (double)w->kinds[k].params);
    }
    printf("files          %zu, %.2f MiB on disk\n", r->ck->n_files, (double)r->ck->total_bytes / 1048576.0);
    printf("kv cache       %llu B/token/layer (layer 0), %.1f KiB/token (%s)\n", (unsigned long long)r->kv_layer0,
           (double)r->kv_token / 1024.0, r->mla.on ? kv_dtype_name(r->latent_dtype) : "f32");
    if (r->mla.on)
        printf("  mla latent   %llu values (kv_lora_rank + rope) + indexer key %llu values on %d of %d layers;"
               " expanded K/V would be %llu values\n",
               (unsigned long long)r->mla.latent, (unsigned long long)r->mla.index, r->mla.full_layers, d->n_layers,
               (unsigned long long)r->mla.expanded);
    printf("memory needed  %.2f MiB weights + %.1f MiB KV per 1k tokens\n", (double)r->weight_bytes / 1048576.0,
           (double)r->kv_token * 1000.0 / 1048576.0);
}

int cmd_info(int argc, char **argv)
{
    struct cli_opt opts[] = {
        {.name = "model", .metavar = "DIR", .help = "checkpoint directory (default: the shipped model)"},
        {.name = "kv-cache-dtype", .metavar = "T", .help = "MLA latent cache rows: bf16 (default), f32 or fp8"},
        {.name = "json", .help = "print JSON instead of a table"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    struct err err = {0};
    enum cli_result r = cli_parse(argc, argv, opts, n, &err);
    if (r == CLI_HELP) {
        cli_print_help("moeserve info [--model DIR] [--kv-cache-dtype T] [--json]",
                       "Describes a checkpoint: family, layers, parameters, bytes per format, memory needed.",
                       opts, n);
        return 0;
    }
    if (r == CLI_ERROR) {
        LOG_ERROR("info: %s", err.msg);
        return 2;
    }
    const char *dir = cli_get(opts, n, "model", cli_default_model());
    struct model_desc d;
    if (model_desc_load(&d, dir, &err)) {
        LOG_ERROR("%s", err.msg);
        return 1;
    }
    const char *kvt = cli_get(opts, n, "kv-cache-dtype", NULL);
    int kv_req = kvt ? kv_dtype_parse(kvt) : KV_DTYPE_AUTO;
    if (kv_cache_check_dtype(&d, kv_req, &err)) {
        LOG_ERROR("info: %s", err.msg);
        model_desc_free(&d);
        return 2;
    }
    struct checkpoint ck;
    struct backend be;
    struct model_weights w;
    struct quant_config qc;
    int rc = 1;
    if (quant_config_load(&qc, dir, &err)) {
        LOG_ERROR("%s", err.msg);
        model_desc_free(&d);
        return 1;
    }
    if (checkpoint_open(&ck, dir, &err)) {
        LOG_ERROR("%s", err.msg);
        model_desc_free(&d);
        quant_config_free(&qc);
        return 1;
    }
    backend_cpu_create(&be, &err);
    if (model_weights_load(&w, &d, &ck, &qc, &be, &err)) {
        LOG_ERROR("%s", err.msg);
        goto done;
    }
    struct info_report rep;
    info_collect_report(&rep, dir, &d, &w, &qc, &ck, kv_cache_latent_dtype(kv_req));
    if (cli_flag(opts, n, "json"))
        info_print_json(&rep);
    else
        info_print_table(&rep);
    rc = 0;
    model_weights_free(&w);
done:
    quant_config_free(&qc);
    backend_destroy(&be);
    checkpoint_close(&ck);
    model_desc_free(&d);
    return rc;
}
