/* quant_codec.h — encoding fp32 weights into NVFP4 and FP8 block formats.
 *
 * The producer side of ../shared/spec/nvfp4.md: round-to-nearest-even casts
 * to E4M3 (OCP "fn", saturating at 448) and E2M1 (ties to the even code,
 * saturating at 6), ModelOpt's two-level NVFP4 scaling and DeepSeek's
 * 128x128 FP8 block scaling. Decoding lives in base/dtype.h and
 * weight_dequant_row().
 *
 * defines: f32_to_e4m3(), f32_to_e2m1(), nvfp4_global_scale(), nvfp4_quantize_row(),
 *          fp8_block_quantize()
 */
#ifndef MOESERVE_FORMAT_QUANT_CODEC_H
#define MOESERVE_FORMAT_QUANT_CODEC_H

#include <stddef.h>
#include <stdint.h>

uint8_t f32_to_e4m3(float x);
/* 4-bit code: bit 3 sign, magnitude index into {0, .5, 1, 1.5, 2, 3, 4, 6}. */
uint8_t f32_to_e2m1(float x);

/* amax(|W|) / (6 * 448), or 1 for an all-zero tensor. */
float nvfp4_global_scale(float amax);
/* One row of K (multiple of 16) values -> K/2 code bytes (low nibble first)
 * and K/16 E4M3 block scales. */
void nvfp4_quantize_row(const float *w, size_t K, float scale2, uint8_t *codes, uint8_t *scales);
/* W [N, K] -> E4M3 [N, K] and f32 scale [ceil(N/128), ceil(K/128)] with
 * W ~= e4m3 * scale (the checkpoint calls it weight_scale_inv). */
void fp8_block_quantize(const float *w, size_t N, size_t K, uint8_t *q, float *scale);

#endif
