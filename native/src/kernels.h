/* Internal kernel interface: per-type, per-ISA dot products and dequantizers.
 * Every SIMD kernel has a scalar twin (isa = EI_ISA_SCALAR) that is its oracle. */
#ifndef EI_KERNELS_H
#define EI_KERNELS_H
#include <stdint.h>
#include "edgeinfer.h"

/* 8-bit activation block: x[i] ~= d * q[i]; s = d * sum(q) (for weight types with a min/offset). */
#define EI_QA_BLOCK 32
typedef struct {
    float d;
    float s;
    int8_t q[EI_QA_BLOCK];
} ei_q8a;

/* Quantized weight types take activations as ei_q8a blocks; float weight types
 * (F32, F16, BF16) take plain float activations. */
int ei_type_uses_q8a(int type);

/* n must be a multiple of EI_QA_BLOCK. */
void ei_quantize_act(int isa, const float *x, int64_t n, ei_q8a *out);

typedef void (*ei_dequant_fn)(const void *src, float *dst, int64_t n);
/* act is const ei_q8a * or const float * depending on ei_type_uses_q8a(type). */
typedef float (*ei_dot_fn)(int64_t n, const void *row, const void *act);

/* Four tokens at once: out[t] = dot(row, act + t * act_stride) for t < 4, each
 * bit-identical to what the type's ei_dot_fn gives for that token alone. */
typedef void (*ei_dot4_fn)(int64_t n, const void *row, const void *act, int64_t act_stride, float *out);

/* NULL when the type or ISA is not supported (ISA not compiled or not on this CPU). */
ei_dequant_fn ei_get_dequant(int type, int isa);
ei_dot_fn ei_get_dot(int type, int isa);
ei_dot4_fn ei_get_dot4(int type, int isa);   /* NULL: use ei_get_dot per token */

/* Bytes of one row of n elements (n a multiple of the block size), 0 if invalid. */
int64_t ei_row_bytes(int type, int64_t n);

/* y[t * ldy + r] = dot(row r, act of token t) for r in [r0, r1), t in [0, n_tok).
 * act_stride is the byte distance between consecutive tokens' activations.
 * Rows are visited in blocks so each weight row is read once for all tokens. */
void ei_matmul_rows(int type, int isa, const void *w, int64_t n_cols, int64_t r0, int64_t r1,
                    const void *act, int64_t act_stride, int64_t n_tok, float *y, int64_t ldy);

/* fp16 <-> fp32 conversions (IEEE half), scalar. */
float ei_fp16_to_fp32(uint16_t h);
uint16_t ei_fp32_to_fp16(float f);
float ei_bf16_to_fp32(uint16_t h);

/* Runtime CPU detection (cpuid on x86). */
int ei_cpu_best_isa(void);
#endif
