/* dtype.c — names and sizes of checkpoint element types (see dtype.h). */
#include "base/dtype.h"

static const struct {
    const char *name;
    size_t size;
} DTYPE_INFO[DTYPE_COUNT] = {
    [DTYPE_BF16] = {"BF16", 2}, [DTYPE_F16] = {"F16", 2},         [DTYPE_F32] = {"F32", 4},
    [DTYPE_F64] = {"F64", 8},   [DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [DTYPE_U8] = {"U8", 1},
    [DTYPE_I8] = {"I8", 1},     [DTYPE_I16] = {"I16", 2},         [DTYPE_I32] = {"I32", 4},
    [DTYPE_I64] = {"I64", 8},   [DTYPE_BOOL] = {"BOOL", 1},
};

size_t dtype_size(enum dtype t)
{
    return (unsigned)t < DTYPE_COUNT ? DTYPE_INFO[t].size : 0;
}

const char *dtype_name(enum dtype t)
{
    return (unsigned)t < DTYPE_COUNT ? DTYPE_INFO[t].name : "?";
}

bool dtype_parse(const char *s, enum dtype *out)
{
    for (int i = 0; i < DTYPE_COUNT; i++) {
        if (strcmp(s, DTYPE_INFO[i].name) == 0) {
            *out = (enum dtype)i;
            return true;
        }
    }
    return false;
}
