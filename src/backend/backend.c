/* backend.c — backend-independent helpers (see backend.h). */
#include "backend/backend.h"

#include <string.h>

size_t backend_moe_workspace_floats(int n_tokens, int n_used, int d_model, int d_expert)
{
    size_t pairs = (size_t)n_tokens * (size_t)n_used;
    /* gathered x, gate, up, expert output; plus two int32 index lists stored as floats' room */
    return pairs * ((size_t)d_model * 2 + (size_t)d_expert * 2) + pairs * 2 + 16;
}

const char *kv_dtype_name(enum kv_dtype t)
{
    switch (t) {
    case KV_DTYPE_F32: return "f32";
    case KV_DTYPE_BF16: return "bf16";
    case KV_DTYPE_FP8: return "fp8";
    }
    return "?";
}

int kv_dtype_parse(const char *s)
{
    for (int t = KV_DTYPE_F32; t <= KV_DTYPE_FP8; t++)
        if (s && !strcmp(s, kv_dtype_name((enum kv_dtype)t)))
            return t;
    return -1;
}

size_t kv_latent_row_bytes(enum kv_dtype t, int kv_rank, int rope)
{
    if (t == KV_DTYPE_FP8)
        return (size_t)kv_rank + 4 * (size_t)((kv_rank + KV_FP8_BLOCK - 1) / KV_FP8_BLOCK) + 2 * (size_t)rope;
    return (size_t)(kv_rank + rope) * (t == KV_DTYPE_F32 ? 4u : 2u);
}

size_t kv_index_row_bytes(enum kv_dtype t, int dim)
{
    return kv_latent_row_bytes(t, dim, 0);
}

size_t backend_dsa_workspace_floats(int n_tokens, int topk)
{
    /* one candidate heap per token: (score, position) pairs */
    return (size_t)n_tokens * (size_t)topk * 2 + 16;
}

void backend_destroy(struct backend *be)
{
    if (be->ops && be->ops->destroy)
        be->ops->destroy(be);
    memset(be, 0, sizeof *be);
}
