/* Private to the quantization kernels: small inline helpers and the per-ISA
 * kernel declarations that kernels.c puts in its tables. The block layouts are
 * the structs of blocks.h. */
#ifndef EI_QUANTS_IMPL_H
#define EI_QUANTS_IMPL_H
#include <stdint.h>
#include <string.h>
#include "blocks.h"
#include "kernels.h"

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

/* Q3_K: 6-bit scale s (0..15) from the 12 packed bytes, minus its offset of 32. */
static inline int ei_q3k_scale(const uint8_t *sc, int s) {
    const int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4;
    return (lo | (((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4)) - 32;
}

/* IQ4_XS: 6-bit scale of sub-block s (0..7), minus its offset of 32. */
static inline int ei_iq4xs_scale(const uint8_t *scales_l, uint16_t scales_h, int s) {
    return (((scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((scales_h >> (2 * s)) & 3) << 4)) - 32;
}

/* Kernel declarations per ISA suffix, one per weight type. */
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

#define EI_DOT_Q_DECL(isa)                                                    \
    float ei_dot_q4_0_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q4_1_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q5_0_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q5_1_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q8_0_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q4_k_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q5_k_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q6_k_##isa(int64_t n, const void *row, const void *act);

#define EI_DOT_DECL(isa)                                                      \
    float ei_dot_f32_##isa(int64_t n, const void *row, const void *act);      \
    float ei_dot_f16_##isa(int64_t n, const void *row, const void *act);      \
    float ei_dot_bf16_##isa(int64_t n, const void *row, const void *act);     \
    EI_DOT_Q_DECL(isa)

EI_DEQ_DECL(scalar)
EI_DOT_DECL(scalar)
void ei_quantize_act_scalar(const float *x, int64_t n, ei_q8a *out);

/* The smaller types llama.cpp writes (kernels.c's SMALL_TYPES): a scalar dequantizer and dot
 * everywhere, SIMD dots on their GGUF layout where written (packed.h packs them for VNNI). */
#define EI_SMALL_TYPES_DOT_DECL(isa)                                          \
    float ei_dot_q2_k_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_q3_k_##isa(int64_t n, const void *row, const void *act);     \
    float ei_dot_iq4_nl_##isa(int64_t n, const void *row, const void *act);   \
    float ei_dot_iq4_xs_##isa(int64_t n, const void *row, const void *act);
void ei_deq_q2_k_scalar(const void *src, float *dst, int64_t n);
void ei_deq_q3_k_scalar(const void *src, float *dst, int64_t n);
void ei_deq_iq4_nl_scalar(const void *src, float *dst, int64_t n);
void ei_deq_iq4_xs_scalar(const void *src, float *dst, int64_t n);
EI_SMALL_TYPES_DOT_DECL(scalar)

#if defined(__x86_64__)
EI_SMALL_TYPES_DOT_DECL(avx2)
EI_SMALL_TYPES_DOT_DECL(avx512)
void ei_dot4_q2_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_q3_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_iq4_nl_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
void ei_dot4_iq4_xs_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out);
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

#if defined(__aarch64__)
EI_DEQ_DECL(neon)
EI_DOT_DECL(neon)      /* plain ASIMD */
EI_DOT_Q_DECL(neondot)   /* ARMv8.2 dotprod build of the integer dots */
EI_SMALL_TYPES_DOT_DECL(neon)
EI_SMALL_TYPES_DOT_DECL(neondot)
void ei_quantize_act_neon(const float *x, int64_t n, ei_q8a *out);
#endif
#endif
