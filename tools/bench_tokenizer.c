/* bench_tokenizer.c — single-thread encode throughput over a corpus, beside HF.
 *
 * Usage: bench_tokenizer TOKENIZER_JSON CORPUS_TXT [HF_BENCH_JSON NAME]
 * The corpus (tools/make_tokenizer_corpus.py) is split into documents at
 * "\n\n" exactly like Python's str.split("\n\n"); each document is encoded
 * with add_special_tokens = false, one thread. Prints MB/s (best of 3 runs,
 * MB = 1e6 bytes of the whole corpus, as tools/bench_tokenizer_hf.py), the
 * number of ids and the SHA-256 of all ids as 4-byte little-endian words.
 * Given hf_bench.json and the tokenizer's name there, also compares n_ids and
 * the hash with HF's and prints HF's speed; exit status 1 on a mismatch.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "base/mapped_file.h"
#include "format/tokenizer.h"

/* ---- SHA-256 (FIPS 180-4), enough for a checksum ---- */

struct sha256 {
    uint32_t h[8];
    uint64_t len;
    unsigned char buf[64];
    size_t n;
};

static const uint32_t SHA_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR(x, n) ((x) >> (n) | (x) << (32 - (n)))

static void sha256_block(struct sha256 *s, const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
               p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6],
             h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + SHA_K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d;
    s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}

static void sha256_init(struct sha256 *s)
{
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, H0, sizeof H0);
    s->len = 0;
    s->n = 0;
}

static void sha256_update(struct sha256 *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    s->len += n;
    while (n--) {
        s->buf[s->n++] = *p++;
        if (s->n == 64) {
            sha256_block(s, s->buf);
            s->n = 0;
        }
    }
}

static void sha256_hex(struct sha256 *s, char out[65])
{
    uint64_t bits = s->len * 8;
    unsigned char pad = 0x80;
    sha256_update(s, &pad, 1);
    pad = 0;
    while (s->n != 56)
        sha256_update(s, &pad, 1);
    unsigned char l[8];
    for (int i = 0; i < 8; i++)
        l[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha256_update(s, l, 8);
    for (int i = 0; i < 8; i++)
        sprintf(out + 8 * i, "%08x", s->h[i]);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON CORPUS_TXT [HF_BENCH_JSON NAME]\n", argv[0]);
        return 2;
    }
    struct err err = {0};
    struct tokenizer *t = NULL;
    struct mapped_file mf = {0};
    double t0 = now_s();
    if (tokenizer_load(&t, argv[1], &err) || mapped_file_open(&mf, argv[2], &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    double t_load = now_s() - t0;
    const char *text = mf.data ? mf.data : "";
    size_t size = mf.size;

    /* documents: str.split("\n\n") — separators never overlap, empty parts kept */
    size_t n_docs = 1;
    for (const char *p = text; (p = memmem(p, size - (size_t)(p - text), "\n\n", 2)); p += 2)
        n_docs++;
    const char **doc = malloc(n_docs * sizeof *doc);
    size_t *doc_len = malloc(n_docs * sizeof *doc_len);
    if (!doc || !doc_len)
        return 1;
    const char *start = text;
    for (size_t i = 0; i < n_docs; i++) {
        const char *sep = memmem(start, size - (size_t)(start - text), "\n\n", 2);
        const char *end = sep ? sep : text + size;
        doc[i] = start;
        doc_len[i] = (size_t)(end - start);
        start = end + 2;
    }

    struct tok_ids ids = {0};
    double best = 1e30;
    for (int run = 0; run < 3; run++) {
        ids.n = 0;
        double a = now_s();
        for (size_t i = 0; i < n_docs; i++)
            if (tokenizer_encode(t, doc[i], doc_len[i], false, &ids, &err)) {
                fprintf(stderr, "error: document %zu: %s\n", i, err.msg);
                return 1;
            }
        double dt = now_s() - a;
        best = dt < best ? dt : best;
    }
    struct sha256 sh;
    sha256_init(&sh);
    for (size_t i = 0; i < ids.n; i++) {
        uint32_t v = (uint32_t)ids.ids[i];
        unsigned char le[4] = {v & 255, v >> 8 & 255, v >> 16 & 255, v >> 24};
        sha256_update(&sh, le, 4);
    }
    char hex[65];
    sha256_hex(&sh, hex);
    double mbs = size / best / 1e6;
    printf("%s: %zu bytes, %zu documents, load %.2f s\n", argv[1], size, n_docs, t_load);
    printf("moeserve: %.3f MB/s (best of 3: %.3f s), n_ids %zu, sha256_ids %s\n", mbs, best, ids.n, hex);

    int rc = 0;
    if (argc == 5) {
        struct json *hf = NULL;
        if (json_parse_file(argv[3], &hf, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            return 1;
        }
        const struct json *r = json_get(json_get(hf, "results"), argv[4]);
        const char *hsha = json_string(json_get(r, "sha256_ids"));
        double hn = json_number(json_get(r, "n_ids")), hmbs = json_number(json_get(r, "mb_per_s"));
        bool same = hsha && !strcmp(hsha, hex) && hn == (double)ids.n;
        printf("hf:       %.3f MB/s, n_ids %.0f, sha256_ids %s\n", hmbs, hn, hsha ? hsha : "(missing)");
        printf("%s: ids %s HF, speed %.2fx HF\n", argv[4], same ? "IDENTICAL to" : "DIFFER from", mbs / hmbs);
        rc = same ? 0 : 1;
        json_free(hf);
    }
    tok_ids_free(&ids);
    free(doc);
    free(doc_len);
    mapped_file_close(&mf);
    tokenizer_free(t);
    return rc;
}
