/* Private to the quantization kernels: GGUF block layouts, small inline helpers
 * and the per-ISA kernel declarations that kernels.c puts in its tables.
 *
 * Block layouts (little endian, byte offsets), exactly as GGUF stores them:
 *   Q4_0  18 B / 32:  d f16 | qs[16]              x = d * (q - 8)
 *   Q4_1  20 B / 32:  d f16 | m f16 | qs[16]      x = d * q + m
 *   Q5_0  22 B / 32:  d f16 | qh u32 | qs[16]     x = d * (q - 16)
 *   Q5_1  24 B / 32:  d f16 | m f16 | qh u32 | qs[16]   x = d * q + m
 *   Q8_0  34 B / 32:  d f16 | qs[32] int8         x = d * q
 *   Q4_K 144 B / 256: d f16 | dmin f16 | scales[12] | qs[128]
 *   Q5_K 176 B / 256: d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
 *   Q6_K 210 B / 256: ql[128] | qh[64] | scales[16] int8 | d f16
 * 4-bit blocks of 32: element j < 16 is the low nibble of qs[j], element j + 16
 * its high nibble; bit j of qh is bit 4 of element j.
 * Q4_K/Q5_K: sub-block j (32 elements) takes nibbles of qs[32*(j/2) ..] (low for
 * even j, high for odd), 6-bit scale/min pair j from `scales`, and (Q5_K) bit j
 * of qh[l] as bit 4 of element l; x = (d * sc) * q - (dmin * m).
 * Q6_K: element e = 128*h + 32*k + l (h < 2, k < 4, l < 32) has
 * low 4 bits (ql[64*h + 32*(k&1) + l] >> 4*(k>>1)) & 15 and high 2 bits
 * (qh[32*h + l] >> 2*k) & 3; x = (d * scales[e/16]) * (q - 32).
 */
#ifndef EI_QUANTS_IMPL_H
#define EI_QUANTS_IMPL_H
#include <stdint.h>
#include <string.h>
#include "kernels.h"

#define QK 32
#define QKK 256
#define Q4_0_BYTES 18
#define Q4_1_BYTES 20
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24
#define Q8_0_BYTES 34
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210

/* Dequantization must round exactly like gguf.quants (float32, no fused
 * multiply-add): forbid the compiler from contracting a*b+c. */
#if defined(__clang__)
#define EI_NO_CONTRACT
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#define EI_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define EI_NO_CONTRACT
#endif

static inline uint16_t ei_ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline uint32_t ei_ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Exact IEEE half -> float (normals, subnormals, inf, nan), no hardware needed. */
static inline float ei_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal: man * 2^-24, normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K / Q5_K: 6-bit scale and min of sub-block j from the 12 packed bytes. */
static inline void ei_k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Kernel lists: X(name) for every weight type, in the order of the tables. */
#define EI_DEQ_DECL(isa)                                                      \
    void ei_deq_f32_##isa(const void *src, float *dst, int64_t n);            \
    void ei_deq_f16_##isa(const void *src, float *dst, int64_t n);            \
    void ei_deq_bf16_##isa(const void *src, float *dst, int64_t n);           \
    void ei_deq_q4_0_##isa(const void *src, float *dst, int64_t n);           \
    void ei_deq_q4_1_##isa(const void *src, float *dst, int64_t n);           \
    void ei_deq_q5_0_##isa(const void *src, float *dst, int64_t n);           \
    void ei_deq_q5_1_##isa(const void *src, float *dst, int64_t n);           \
    void ei_deq_q8_0_##isa(const void *src, float *dst, int64_t n);           \
    void ei_deq_q4_k_##isa(const void *src, float *dst, int64_t n);           \
    void ei_deq_q5_k_##isa(const void *src, float *dst, int64_t n);           \
    void ei_deq_q6_k_##isa(const void *src, float *dst, int64_t n);

#define EI_DOT_DECL(isa)                                                      \
    float ei_dot_f32_##isa(int64_t n, const void *row, const void *act);      \
    float ei_dot_f16_##isa(int64_t n, const void *row, const void *act);      \
    float ei_dot_bf16_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q4_0_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q4_1_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q5_0_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q5_1_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q8_0_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q4_k_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q5_k_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q6_k_##isa(int64_t n, const void *row, const void *act);

EI_DEQ_DECL(scalar)
EI_DOT_DECL(scalar)
void ei_quantize_act_scalar(const float *x, int64_t n, ei_q8a *out);

#if defined(__x86_64__)
EI_DEQ_DECL(avx2)
EI_DOT_DECL(avx2)
void ei_quantize_act_avx2(const float *x, int64_t n, ei_q8a *out);
EI_DOT_DECL(avx512)
void ei_quantize_act_avx512(const float *x, int64_t n, ei_q8a *out);
void ei_dot4_q4_0_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_q4_1_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_q5_0_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_q5_1_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_q8_0_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_q4_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_q5_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_q6_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
#endif
#endif
