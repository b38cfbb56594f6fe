/* AVX-512 (F/BW/VL/DQ + VNNI) dot products, two 32-element blocks per 512-bit
 * register with vpdpbusd (u8 x s8 -> int32). Activation quantization and
 * dequantization reuse the AVX2 kernels (kernels.c points the table there).
 *
 * vpdpbusd needs an unsigned left operand, so signed weights q are fed as the
 * unsigned q + o and o * sum(y) is subtracted (same integer result). */
#include "quants_impl.h"

#include <math.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define AX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

static inline AX float h2f(const void *p) { return _cvtsh_ss(ei_ld16(p)); }

static inline AX __m512i cat256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* lanes 0..7 = s0, lanes 8..15 = s1 */
static inline AX __m512 scale2(float s0, float s1) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0)), _mm256_set1_ps(s1), 1);
}

static inline AX __m256i act_q(const ei_q8a *a) { return _mm256_loadu_si256((const __m256i *)a->q); }
static inline AX __m512i act_q2(const ei_q8a *a) { return cat256(act_q(a), act_q(a + 1)); }

/* 16 packed bytes -> 32 bytes: low nibbles then high nibbles */
static inline AX __m256i nibbles32(const uint8_t *p) {
    const __m128i x = _mm_loadu_si128((const __m128i *)p);
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

static inline AX __m512i dp(__m512i u, __m512i s) { return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s); }
static inline AX __m256i dp256(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }

static inline AX float hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline AX float hsum(__m512 acc, __m256 acc8) {
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    return hsum8(_mm256_add_ps(s, acc8));
}

/* ---------------- float weights ---------------- */

AX float ei_dot_f32_avx512(int64_t n, const void *row, const void *act) {
    const float *w = (const float *)row, *x = (const float *)act;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, w + i), _mm512_maskz_loadu_ps(k, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

AX float ei_dot_f16_avx512(int64_t n, const void *row, const void *act) {
    const uint16_t *w = (const uint16_t *)row;
    const float *x = (const float *)act;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i))), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i + 16))),
                             _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, w + i)), _mm512_maskz_loadu_ps(k, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

AX float ei_dot_bf16_avx512(int64_t n, const void *row, const void *act) {
    const uint16_t *w = (const uint16_t *)row;
    const float *x = (const float *)act;
    __m512 a0 = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512i v = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, w + i)), 16);
        a0 = _mm512_fmadd_ps(_mm512_castsi512_ps(v), _mm512_maskz_loadu_ps(k, x + i), a0);
    }
    return _mm512_reduce_add_ps(a0);
}

/* ---------------- 32-block types, two blocks per step ---------------- */

AX float ei_dot_q8_0_avx512(int64_t n, const void *row, const void *act) {
    const uint8_t *b = (const uint8_t *)row;
    const ei_q8a *a = (const ei_q8a *)act;
    const int64_t nb = n / QK;
    const __m512i off = _mm512_set1_epi8((char)0x80);
    __m512 acc = _mm512_setzero_ps();
    __m256 acc8 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, b += 2 * sizeof(block_q8_0), a += 2) {
        const __m512i q = cat256(_mm256_loadu_si256((const __m256i *)(b + 2)),
                                 _mm256_loadu_si256((const __m256i *)(b + sizeof(block_q8_0) + 2)));
        const __m512i y = act_q2(a);
        const __m512i s = _mm512_sub_epi32(dp(_mm512_xor_si512(q, off), y), dp(off, y));
        acc = _mm512_fmadd_ps(scale2(h2f(b) * a[0].d, h2f(b + sizeof(block_q8_0)) * a[1].d), _mm512_cvtepi32_ps(s), acc);
    }
    if (i < nb) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2)), y = act_q(a);
        const __m256i o = _mm512_castsi512_si256(off);
        const __m256i s = _mm256_sub_epi32(dp256(_mm256_xor_si256(q, o), y), dp256(o, y));
        acc8 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b) * a->d), _mm256_cvtepi32_ps(s), acc8);
    }
    return hsum(acc, acc8);
}

/* Q8_0 for four tokens: the arithmetic of ei_dot_q8_0_avx512 per token. */
AX void ei_dot4_q8_0_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) {
    const uint8_t *b = (const uint8_t *)row;
    const int64_t nb = n / QK;
    const __m512i off = _mm512_set1_epi8((char)0x80);
    const __m256i o = _mm512_castsi512_si256(off);
    const ei_q8a *a[4];
    __m512 acc[4];
    __m256 acc8[4];
    for (int t = 0; t < 4; t++) {
        a[t] = (const ei_q8a *)((const uint8_t *)act + t * stride);
        acc[t] = _mm512_setzero_ps();
        acc8[t] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, b += 2 * sizeof(block_q8_0)) {
        const __m512i qx = _mm512_xor_si512(cat256(_mm256_loadu_si256((const __m256i *)(b + 2)),
                                                   _mm256_loadu_si256((const __m256i *)(b + sizeof(block_q8_0) + 2))), off);
        const float d0 = h2f(b), d1 = h2f(b + sizeof(block_q8_0));
        for (int t = 0; t < 4; t++) {
            const ei_q8a *at = a[t] + i;
            const __m512i y = act_q2(at);
            const __m512i s = _mm512_sub_epi32(dp(qx, y), dp(off, y));
            acc[t] = _mm512_fmadd_ps(scale2(d0 * at[0].d, d1 * at[1].d), _mm512_cvtepi32_ps(s), acc[t]);
        }
    }
    if (i < nb) {
        const __m256i qx = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), o);
        const float d0 = h2f(b);
        for (int t = 0; t < 4; t++) {
            const ei_q8a *at = a[t] + i;
            const __m256i y = act_q(at);
            const __m256i s = _mm256_sub_epi32(dp256(qx, y), dp256(o, y));
            acc8[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * at->d), _mm256_cvtepi32_ps(s), acc8[t]);
        }
    }
    for (int t = 0; t < 4; t++) out[t] = hsum(acc[t], acc8[t]);
}

/* Shared body of the 4/5-bit 32-blocks: one block per 256-bit vpdpbusd, two
 * independent accumulators. (512-bit registers holding two blocks measured no
 * faster on Zen 4, whose 512-bit ops are double-pumped, and need cross-lane
 * inserts.) Q(b) gives the unsigned values of the block at b, OFF the offset to
 * subtract (0, 8 or 16; o * sum(y) is subtracted in int32), HAS_M whether the
 * block carries a min (at b + 2). */
#define DOT32_BODY(BYTES, Q, OFF, HAS_M)                                                          \
    const uint8_t *b = (const uint8_t *)row;                                                      \
    const ei_q8a *a = (const ei_q8a *)act;                                                        \
    const int64_t nb = n / QK;                                                                    \
    const __m256i off = _mm256_set1_epi8(OFF);                                                    \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                \
    float summ0 = 0.0f, summ1 = 0.0f;                                                             \
    int64_t i = 0;                                                                                \
    for (; i + 2 <= nb; i += 2, b += 2 * (BYTES), a += 2) {                                       \
        const __m256i y0 = act_q(a), y1 = act_q(a + 1);                                           \
        __m256i s0 = dp256(Q(b), y0), s1 = dp256(Q(b + (BYTES)), y1);                             \
        if (OFF) {                                                                                \
            s0 = _mm256_sub_epi32(s0, dp256(off, y0));                                            \
            s1 = _mm256_sub_epi32(s1, dp256(off, y1));                                            \
        }                                                                                         \
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b) * a[0].d), _mm256_cvtepi32_ps(s0), acc0);    \
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b + (BYTES)) * a[1].d), _mm256_cvtepi32_ps(s1), acc1); \
        if (HAS_M) {                                                                              \
            summ0 = fmaf(h2f(b + 2), a[0].s, summ0);                                              \
            summ1 = fmaf(h2f(b + (BYTES) + 2), a[1].s, summ1);                                    \
        }                                                                                         \
    }                                                                                             \
    if (i < nb) {                                                                                 \
        const __m256i y = act_q(a);                                                               \
        __m256i s = dp256(Q(b), y);                                                               \
        if (OFF) s = _mm256_sub_epi32(s, dp256(off, y));                                          \
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(b) * a->d), _mm256_cvtepi32_ps(s), acc0);       \
        if (HAS_M) summ0 = fmaf(h2f(b + 2), a->s, summ0);                                         \
    }                                                                                             \
    return hsum8(_mm256_add_ps(acc0, acc1)) + (summ0 + summ1);

/* bit i of qh -> 16 in byte i */
static inline AX __m256i qh16(uint32_t qh) { return _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(16)); }

#define Q_Q4_0(p) nibbles32((p) + 2)
#define Q_Q4_1(p) nibbles32((p) + 4)
#define Q_Q5_0(p) _mm256_or_si256(nibbles32((p) + 6), qh16(ei_ld32((p) + 2)))
#define Q_Q5_1(p) _mm256_or_si256(nibbles32((p) + 8), qh16(ei_ld32((p) + 4)))

/* Four tokens against one weight row: the weights of each block are expanded
 * once and used four times. Each token's arithmetic is exactly DOT32_BODY's
 * (same accumulators, same order, explicit fma), so a token's result is
 * bit-identical whether it is computed alone or in a group: batch invariance. */
#define DOT32_X4_BODY(BYTES, Q, OFF, HAS_M)                                                       \
    const uint8_t *b = (const uint8_t *)row;                                                      \
    const int64_t nb = n / QK;                                                                    \
    const __m256i off = _mm256_set1_epi8(OFF);                                                    \
    const ei_q8a *a[4];                                                                           \
    __m256 acc0[4], acc1[4];                                                                      \
    float summ0[4], summ1[4];                                                                     \
    for (int t = 0; t < 4; t++) {                                                                 \
        a[t] = (const ei_q8a *)((const uint8_t *)act + t * stride);                               \
        acc0[t] = acc1[t] = _mm256_setzero_ps();                                                  \
        summ0[t] = summ1[t] = 0.0f;                                                               \
    }                                                                                             \
    int64_t i = 0;                                                                                \
    for (; i + 2 <= nb; i += 2, b += 2 * (BYTES)) {                                               \
        const __m256i q0 = Q(b), q1 = Q(b + (BYTES));                                             \
        const float d0 = h2f(b), d1 = h2f(b + (BYTES));                                           \
        const float m0 = HAS_M ? h2f(b + 2) : 0.0f, m1 = HAS_M ? h2f(b + (BYTES) + 2) : 0.0f;     \
        for (int t = 0; t < 4; t++) {                                                             \
            const ei_q8a *at = a[t] + i;                                                          \
            const __m256i y0 = act_q(at), y1 = act_q(at + 1);                                     \
            __m256i s0 = dp256(q0, y0), s1 = dp256(q1, y1);                                       \
            if (OFF) {                                                                            \
                s0 = _mm256_sub_epi32(s0, dp256(off, y0));                                        \
                s1 = _mm256_sub_epi32(s1, dp256(off, y1));                                        \
            }                                                                                     \
            acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * at[0].d), _mm256_cvtepi32_ps(s0), acc0[t]); \
            acc1[t] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * at[1].d), _mm256_cvtepi32_ps(s1), acc1[t]); \
            if (HAS_M) {                                                                          \
                summ0[t] = fmaf(m0, at[0].s, summ0[t]);                                           \
                summ1[t] = fmaf(m1, at[1].s, summ1[t]);                                           \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    if (i < nb) {                                                                                 \
        const __m256i q = Q(b);                                                                   \
        const float d0 = h2f(b), m0 = HAS_M ? h2f(b + 2) : 0.0f;                                  \
        for (int t = 0; t < 4; t++) {                                                             \
            const ei_q8a *at = a[t] + i;                                                          \
            const __m256i y = act_q(at);                                                          \
            __m256i s = dp256(q, y);                                                              \
            if (OFF) s = _mm256_sub_epi32(s, dp256(off, y));                                      \
            acc0[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * at->d), _mm256_cvtepi32_ps(s), acc0[t]); \
            if (HAS_M) summ0[t] = fmaf(m0, at->s, summ0[t]);                                      \
        }                                                                                         \
    }                                                                                             \
    for (int t = 0; t < 4; t++) out[t] = hsum8(_mm256_add_ps(acc0[t], acc1[t])) + (summ0[t] + summ1[t]);

AX void ei_dot4_q4_0_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { DOT32_X4_BODY(sizeof(block_q4_0), Q_Q4_0, 8, 0) }
AX void ei_dot4_q4_1_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { DOT32_X4_BODY(sizeof(block_q4_1), Q_Q4_1, 0, 1) }
AX void ei_dot4_q5_0_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { DOT32_X4_BODY(sizeof(block_q5_0), Q_Q5_0, 16, 0) }
AX void ei_dot4_q5_1_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { DOT32_X4_BODY(sizeof(block_q5_1), Q_Q5_1, 0, 1) }

AX float ei_dot_q4_0_avx512(int64_t n, const void *row, const void *act) { DOT32_BODY(sizeof(block_q4_0), Q_Q4_0, 8, 0) }
AX float ei_dot_q4_1_avx512(int64_t n, const void *row, const void *act) { DOT32_BODY(sizeof(block_q4_1), Q_Q4_1, 0, 1) }
AX float ei_dot_q5_0_avx512(int64_t n, const void *row, const void *act) { DOT32_BODY(sizeof(block_q5_0), Q_Q5_0, 16, 0) }
AX float ei_dot_q5_1_avx512(int64_t n, const void *row, const void *act) { DOT32_BODY(sizeof(block_q5_1), Q_Q5_1, 0, 1) }

/* ---------------- K-quants: 256-element super-blocks ---------------- */

/* Each K-quant kernel is one body for nt tokens (1 or 4), always inlined with a
 * constant nt: the weights of a sub-block pair are expanded once for all nt
 * tokens, and each token's float ops are the same whatever nt is (batch
 * invariance: the 4-token kernel is bit-identical to four 1-token calls). */
#define INL static inline __attribute__((always_inline)) AX
#define ACT(t) ((const ei_q8a *)((const uint8_t *)act + (t) * stride))

INL void q4k_body(int64_t n, const void *row, const void *act, int64_t stride, float *out, const int nt) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[4];
    float summ[4];
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm512_setzero_ps();
        summ[t] = 0.0f;
    }
    const block_q4_K *b = row;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qs = b->qs;
        for (int p = 0; p < 4; p++) {
            uint8_t sc0, m0, sc1, m1;
            ei_k_scale_min(2 * p, scales, &sc0, &m0);
            ei_k_scale_min(2 * p + 1, scales, &sc1, &m1);
            const float ds0 = d * (float)sc0, ds1 = d * (float)sc1, dm0 = dmin * (float)m0, dm1 = dmin * (float)m1;
            const __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
            const __m512i q = _mm512_and_si512(cat256(x, _mm256_srli_epi16(x, 4)), m4);
            for (int t = 0; t < nt; t++) {
                const ei_q8a *a = ACT(t) + i * 8 + 2 * p;
                acc[t] = _mm512_fmadd_ps(scale2(ds0 * a[0].d, ds1 * a[1].d), _mm512_cvtepi32_ps(dp(q, act_q2(a))), acc[t]);
                summ[t] = fmaf(dm1, a[1].s, fmaf(dm0, a[0].s, summ[t]));
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]) - summ[t];
}

INL void q5k_body(int64_t n, const void *row, const void *act, int64_t stride, float *out, const int nt) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(16);
    __m512 acc[4];
    float summ[4];
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm512_setzero_ps();
        summ[t] = 0.0f;
    }
    const block_q5_K *b = row;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qs = b->qs;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
        for (int p = 0; p < 4; p++) {
            uint8_t sc0, m0, sc1, m1;
            ei_k_scale_min(2 * p, scales, &sc0, &m0);
            ei_k_scale_min(2 * p + 1, scales, &sc1, &m1);
            const float ds0 = d * (float)sc0, ds1 = d * (float)sc1, dm0 = dmin * (float)m0, dm1 = dmin * (float)m1;
            const __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
            const uint64_t k0 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * p))));
            const uint64_t k1 = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * p + 1))));
            __m512i q = _mm512_and_si512(cat256(x, _mm256_srli_epi16(x, 4)), m4);
            q = _mm512_or_si512(q, _mm512_maskz_mov_epi8((__mmask64)(k0 | (k1 << 32)), b4));
            for (int t = 0; t < nt; t++) {
                const ei_q8a *a = ACT(t) + i * 8 + 2 * p;
                acc[t] = _mm512_fmadd_ps(scale2(ds0 * a[0].d, ds1 * a[1].d), _mm512_cvtepi32_ps(dp(q, act_q2(a))), acc[t]);
                summ[t] = fmaf(dm1, a[1].s, fmaf(dm0, a[0].s, summ[t]));
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]) - summ[t];
}

INL void q6k_body(int64_t n, const void *row, const void *act, int64_t stride, float *out, const int nt) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(3), k32 = _mm512_set1_epi8(32);
    /* int8 scales s0..s3 -> int32 lanes s0 x4, s1 x4, s2 x4, s3 x4 */
    const __m128i sidx = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    const block_q6_K *b = row;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const uint8_t *ql = b->ql, *qh = b->qh;
        const uint8_t *sc = (const uint8_t *)b->scales;   /* int8 bytes, sign-extended below */
        const float d = h2f(&b->d);
        for (int j = 0; j < 8; j += 2) {
            /* activation blocks j, j+1 (j even): 64 contiguous ql bytes, one nibble
             * shift; qh bits 2k and 2k+2 of the same 32 bytes */
            const int h = j >> 2, k = j & 3;
            __m512i lo = _mm512_loadu_si512((const void *)(ql + 64 * h));
            lo = _mm512_and_si512(_mm512_srl_epi16(lo, _mm_cvtsi32_si128(4 * (k >> 1))), m4);
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
            __m512i hi = cat256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * k)),
                                _mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * k + 2)));
            hi = _mm512_slli_epi16(_mm512_and_si512(hi, m2), 4);
            const __m512i q = _mm512_or_si512(lo, hi);
            const __m512i s32 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128((int)ei_ld32(sc + 2 * j)), sidx));
            for (int t = 0; t < nt; t++) {
                const ei_q8a *a = ACT(t) + i * 8 + j;
                const __m512i y = act_q2(a);
                const __m512i s = _mm512_sub_epi32(dp(q, y), dp(k32, y)); /* 4-element sums of (q-32)*y */
                acc[t] = _mm512_fmadd_ps(scale2(d * a[0].d, d * a[1].d), _mm512_cvtepi32_ps(_mm512_mullo_epi32(s, s32)), acc[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}

AX float ei_dot_q4_k_avx512(int64_t n, const void *row, const void *act) { float r; q4k_body(n, row, act, 0, &r, 1); return r; }
AX float ei_dot_q5_k_avx512(int64_t n, const void *row, const void *act) { float r; q5k_body(n, row, act, 0, &r, 1); return r; }
AX float ei_dot_q6_k_avx512(int64_t n, const void *row, const void *act) { float r; q6k_body(n, row, act, 0, &r, 1); return r; }
AX void ei_dot4_q4_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { q4k_body(n, row, act, stride, out, 4); }
AX void ei_dot4_q5_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { q5k_body(n, row, act, stride, out, 4); }
AX void ei_dot4_q6_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { q6k_body(n, row, act, stride, out, 4); }

/* ---------------- the smaller types (kernels.c's SMALL_TYPES) on their GGUF layout ----------------
 * (the reference for the packed kernels of packed.c, which the runtime runs). The same one body for nt tokens each. A 64-element chunk is two activation blocks; the
 * 16-element groups of Q2_K / Q3_K are its four 128-bit lanes. */

/* lanes 0..7 = a[0].d, lanes 8..15 = a[1].d */
static inline AX __m512 act_d2(const ei_q8a *a) {
    return _mm512_mask_broadcastss_ps(_mm512_set1_ps(a[0].d), 0xff00, _mm_load_ss(&a[1].d));
}

/* Q3_K's 16 scales minus 32, as int8 (blocks.h's packing) */
static inline AX __m128i q3k_scales16(const uint8_t *s) {
    const __m128i l = _mm_loadl_epi64((const __m128i *)s);
    const __m128i lo = _mm_and_si128(_mm_unpacklo_epi64(l, _mm_srli_epi16(l, 4)), _mm_set1_epi8(15));
    const __m128i h = _mm_srlv_epi32(_mm_set1_epi32((int)ei_ld32(s + 8)), _mm_setr_epi32(0, 2, 4, 6));
    const __m128i hi = _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi8(3)), 4);
    return _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
}

/* the four 16-byte lanes of a 64-element chunk each filled with one byte of v: v[g], .., v[g + 3] */
static inline AX __m512i lanes4(__m128i v, int g) {
    const __m512i idx = _mm512_add_epi8(_mm512_set1_epi8((char)g),
                                        _mm512_set_epi32(0x03030303, 0x03030303, 0x03030303, 0x03030303,
                                                         0x02020202, 0x02020202, 0x02020202, 0x02020202,
                                                         0x01010101, 0x01010101, 0x01010101, 0x01010101, 0, 0, 0, 0));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(v), idx);
}

/* the 2-bit quants of activation blocks j, j + 1 (j even) of a Q2_K / Q3_K super-block */
static inline AX __m512i k2bits2(const uint8_t *qs, int j) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j >> 2)));
    const int k = j & 3;
    return _mm512_and_si512(cat256(_mm256_srli_epi16(x, 2 * k), _mm256_srli_epi16(x, 2 * k + 2)), _mm512_set1_epi8(3));
}

INL void q2k_body(int64_t n, const void *row, const void *act, int64_t stride, float *out, const int nt) {
    /* the scale is folded into the weights (q * sc <= 45) through a per-lane table 0, sc, 2sc, 3sc */
    const __mmask64 b1 = 0x2222222222222222ull, b2 = 0x4444444444444444ull, b3 = 0x8888888888888888ull;
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    const block_q2_K *b = row;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const __m512 d = _mm512_set1_ps(h2f(&b->d)), dmin = _mm512_set1_ps(h2f(&b->dmin));
        const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
        const __m128i s16 = _mm_and_si128(sc, _mm_set1_epi8(15)), m16 = _mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(15));
        for (int j = 0; j < 8; j += 2) {
            const __m512i s = lanes4(s16, 2 * j), m = lanes4(m16, 2 * j);
            const __m512i s2 = _mm512_add_epi8(s, s);
            __m512i tab = _mm512_maskz_mov_epi8(b1, s);
            tab = _mm512_mask_mov_epi8(tab, b2, s2);
            tab = _mm512_mask_mov_epi8(tab, b3, _mm512_add_epi8(s2, s));
            const __m512i w = _mm512_shuffle_epi8(tab, k2bits2(b->qs, j));
            for (int t = 0; t < nt; t++) {
                const ei_q8a *a = ACT(t) + i * 8 + j;
                const __m512i y = act_q2(a);
                const __m512 ad = act_d2(a);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp(w, y)), _mm512_mul_ps(ad, d), acc[t]);
                acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(dp(m, y)), _mm512_mul_ps(ad, dmin), acc[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}

INL void q3k_body(int64_t n, const void *row, const void *act, int64_t stride, float *out, const int nt) {
    const __m512i k4 = _mm512_set1_epi8(4);
    /* int8 scales s0..s3 -> int32 lanes s0 x4, s1 x4, s2 x4, s3 x4 */
    const __m128i sidx = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    const block_q3_K *b = row;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const __m512 d = _mm512_set1_ps(h2f(&b->d));
        const __m128i sc = q3k_scales16(b->scales);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)b->hmask);
        for (int j = 0; j < 8; j += 2) {
            /* q + 4 = the two low bits, plus 4 where the block's hmask bit is set */
            const int bit = 4 * (j >> 2) + (j & 3);
            const uint64_t k0 = _mm256_test_epi8_mask(hm, _mm256_set1_epi8((char)(1 << bit)));
            const uint64_t k1 = _mm256_test_epi8_mask(hm, _mm256_set1_epi8((char)(1 << (bit + 1))));
            const __m512i lo = k2bits2(b->qs, j);
            const __m512i u = _mm512_mask_add_epi8(lo, (__mmask64)(k0 | (k1 << 32)), lo, k4);
            /* d * the scale of each lane's 16-element group (exact: 11 by 6 significant bits) */
            const __m512 ds = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                   _mm_shuffle_epi8(sc, _mm_add_epi8(sidx, _mm_set1_epi8((char)(2 * j)))))));
            for (int t = 0; t < nt; t++) {
                const ei_q8a *a = ACT(t) + i * 8 + j;
                const __m512i y = act_q2(a);
                const __m512i v = _mm512_sub_epi32(dp(u, y), dp(k4, y)); /* 4-element sums of q * y */
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(act_d2(a), ds), acc[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}

/* IQ4 table values + 128 (unsigned, for vpdpbusd) of two 16-byte runs of indices, element order */
static inline AX __m512i iq4_values2(const uint8_t *q0, const uint8_t *q1) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128((const __m128i *)ei_iq4nl_values),
                                                               _mm_set1_epi8((char)0x80)));
    return _mm512_shuffle_epi8(table, cat256(nibbles32(q0), nibbles32(q1)));
}

INL void iq4nl_body(int64_t n, const void *row, const void *act, int64_t stride, float *out, const int nt) {
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    __m512 acc[4];
    __m256 acc8[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps(), acc8[t] = _mm256_setzero_ps();
    const block_iq4_nl *b = row;
    int64_t i = 0;
    for (; i + 2 <= n / QK; i += 2, b += 2) {
        const __m512 dw = scale2(h2f(&b[0].d), h2f(&b[1].d));
        const __m512i u = iq4_values2(b[0].qs, b[1].qs);
        for (int t = 0; t < nt; t++) {
            const ei_q8a *a = ACT(t) + i;
            const __m512i y = act_q2(a);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dp(u, y), dp(k128, y))), _mm512_mul_ps(act_d2(a), dw),
                                     acc[t]);
        }
    }
    if (i < n / QK) {   /* an odd last block */
        const float d0 = h2f(&b->d);
        const __m256i u = _mm512_castsi512_si256(iq4_values2(b->qs, b->qs));
        for (int t = 0; t < nt; t++) {
            const ei_q8a *a = ACT(t) + i;
            const __m256i y = act_q(a);
            const __m256i v = _mm256_sub_epi32(dp256(u, y), dp256(_mm512_castsi512_si256(k128), y));
            acc8[t] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * a->d), _mm256_cvtepi32_ps(v), acc8[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = hsum(acc[t], acc8[t]);
}

INL void iq4xs_body(int64_t n, const void *row, const void *act, int64_t stride, float *out, const int nt) {
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    __m512 acc[4];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    const block_iq4_xs *b = row;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d);
        for (int s = 0; s < 8; s += 2) {
            const __m512 dw = scale2(d * (float)ei_iq4xs_scale(b->scales_l, b->scales_h, s),
                                     d * (float)ei_iq4xs_scale(b->scales_l, b->scales_h, s + 1));
            const __m512i u = iq4_values2(b->qs + 16 * s, b->qs + 16 * s + 16);
            for (int t = 0; t < nt; t++) {
                const ei_q8a *a = ACT(t) + i * 8 + s;
                const __m512i y = act_q2(a);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dp(u, y), dp(k128, y))),
                                         _mm512_mul_ps(act_d2(a), dw), acc[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}

AX float ei_dot_q2_k_avx512(int64_t n, const void *row, const void *act) { float r; q2k_body(n, row, act, 0, &r, 1); return r; }
AX float ei_dot_q3_k_avx512(int64_t n, const void *row, const void *act) { float r; q3k_body(n, row, act, 0, &r, 1); return r; }
AX float ei_dot_iq4_nl_avx512(int64_t n, const void *row, const void *act) { float r; iq4nl_body(n, row, act, 0, &r, 1); return r; }
AX float ei_dot_iq4_xs_avx512(int64_t n, const void *row, const void *act) { float r; iq4xs_body(n, row, act, 0, &r, 1); return r; }
AX void ei_dot4_q2_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { q2k_body(n, row, act, stride, out, 4); }
AX void ei_dot4_q3_k_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { q3k_body(n, row, act, stride, out, 4); }
AX void ei_dot4_iq4_nl_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { iq4nl_body(n, row, act, stride, out, 4); }
AX void ei_dot4_iq4_xs_avx512(int64_t n, const void *row, const void *act, int64_t stride, float *out) { iq4xs_body(n, row, act, stride, out, 4); }

/* Same rounding as the AVX2 version (which is identical to the scalar one). */
AX void ei_quantize_act_avx512(const float *x, int64_t n, ei_q8a *out) { ei_quantize_act_avx2(x, n, out); }

#endif /* __x86_64__ */
