/* NEON kernels (aarch64 only; ASIMD is mandatory there, so this level is always
 * available on arm64). Integer dot products come in two builds, chosen at run
 * time from hwcaps (kernels.c, HWCAP_ASIMDDP):
 *   neon     plain ASIMD: vmull_s8 + vpadalq_s16          (Cortex-A57/A72, Pi 4)
 *   neondot  ARMv8.2 dotprod: vdotq_s32                   (Orin's A78AE, Pi 5)
 * Both compute each 32-element block's integer inner product exactly and then
 * accumulate in float per block, in the order the scalar reference uses, so
 * they agree with it to rounding (NMSE far below 1e-6).
 *
 * Dequantizers and the activation quantizer must be bit-exact with the scalar
 * reference: products and sums are separate vector instructions and the file
 * is compiled with fp contraction off (no fused multiply-add sneaks in).
 *
 * Q2_K, Q3_K, IQ4_NL and IQ4_XS keep their GGUF layout here too (no packed form, the scalar
 * dequantizers): only their dots are NEON (IQ4: vqtbl1q_s8 on the 16 values).
 *
 * The integer dot kernels are written once below (the EI_NEON_PASS section) and
 * instantiated twice by including this file into itself with a different DOT16
 * and function attribute. */
#if !defined(EI_NEON_PASS)
#include "quants_impl.h"

#if defined(__aarch64__)
#pragma GCC optimize("fp-contract=off")
#include <arm_neon.h>

/* ---------------- helpers ---------------- */

/* IEEE half -> float with the FPU (exact for every non-NaN input). */
static inline float h2f(const void *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* 16 packed bytes -> low nibbles (elements 0..15) and high nibbles (16..31). */
static inline void nibbles(const uint8_t *p, uint8x16_t *lo, uint8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(p);
    *lo = vandq_u8(v, vdupq_n_u8(0x0f));
    *hi = vshrq_n_u8(v, 4);
}

/* bit i of qh (i < 32) -> byte i = 16 or 0, as two vectors of 16 bytes. */
static inline void qh_bits16(uint32_t qh, uint8x16_t *h0, uint8x16_t *h1) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(bit);
    const uint8x16_t v0 = vcombine_u8(vdup_n_u8((uint8_t)qh), vdup_n_u8((uint8_t)(qh >> 8)));
    const uint8x16_t v1 = vcombine_u8(vdup_n_u8((uint8_t)(qh >> 16)), vdup_n_u8((uint8_t)(qh >> 24)));
    *h0 = vandq_u8(vtstq_u8(v0, m), vdupq_n_u8(16));
    *h1 = vandq_u8(vtstq_u8(v1, m), vdupq_n_u8(16));
}

/* 16 int8 -> four float32x4, in element order. */
static inline void i8_to_f32(int8x16_t q, float32x4_t f[4]) {
    const int16x8_t l = vmovl_s8(vget_low_s8(q)), h = vmovl_high_s8(q);
    f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(l)));
    f[1] = vcvtq_f32_s32(vmovl_high_s16(l));
    f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
    f[3] = vcvtq_f32_s32(vmovl_high_s16(h));
}

/* dst[0..16) = d * q */
static inline void store_mul(float *dst, int8x16_t q, float d) {
    float32x4_t f[4];
    i8_to_f32(q, f);
    const float32x4_t vd = vdupq_n_f32(d);
    for (int k = 0; k < 4; k++) vst1q_f32(dst + 4 * k, vmulq_f32(vd, f[k]));
}

/* dst[0..16) = d * q + m */
static inline void store_mul_add(float *dst, int8x16_t q, float d, float m) {
    float32x4_t f[4];
    i8_to_f32(q, f);
    const float32x4_t vd = vdupq_n_f32(d), vm = vdupq_n_f32(m);
    for (int k = 0; k < 4; k++) vst1q_f32(dst + 4 * k, vaddq_f32(vmulq_f32(vd, f[k]), vm));
}

/* dst[0..16) = d * q - m */
static inline void store_mul_sub(float *dst, int8x16_t q, float d, float m) {
    float32x4_t f[4];
    i8_to_f32(q, f);
    const float32x4_t vd = vdupq_n_f32(d), vm = vdupq_n_f32(m);
    for (int k = 0; k < 4; k++) vst1q_f32(dst + 4 * k, vsubq_f32(vmulq_f32(vd, f[k]), vm));
}

#define S8(x) vreinterpretq_s8_u8(x)

/* Q2_K / Q3_K: the 2-bit quants of activation block 4h + k, from the 32 bytes qs[32h ..] (v0, v1) */
static inline void k2bits(uint8x16_t v0, uint8x16_t v1, int k, uint8x16_t *q0, uint8x16_t *q1) {
    const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * k));   /* a right shift by 2k */
    const uint8x16_t m3 = vdupq_n_u8(3);
    *q0 = vandq_u8(vshlq_u8(v0, sh), m3);
    *q1 = vandq_u8(vshlq_u8(v1, sh), m3);
}

/* IQ4_NL / IQ4_XS: the table's values of 16 packed index bytes, elements 0..15 (v0) and 16..31 (v1) */
static inline void iq4_values(int8x16_t table, const uint8_t *qs, int8x16_t *v0, int8x16_t *v1) {
    uint8x16_t lo, hi;
    nibbles(qs, &lo, &hi);
    *v0 = vqtbl1q_s8(table, lo);
    *v1 = vqtbl1q_s8(table, hi);
}

/* ---------------- dequantization ---------------- */

void ei_deq_f32_neon(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void ei_deq_f16_neon(const void *src, float *dst, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)(s + 2 * i)));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++) dst[i] = h2f(s + 2 * i);
}

void ei_deq_bf16_neon(const void *src, float *dst, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t v = vld1q_u16((const uint16_t *)(s + 2 * i));
        vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16)));
        vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(v, 16)));
    }
    for (; i < n; i++) {
        uint32_t b = (uint32_t)ei_ld16(s + 2 * i) << 16;
        memcpy(dst + i, &b, 4);
    }
}

void ei_deq_q4_0_neon(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        uint8x16_t lo, hi;
        nibbles(b->qs, &lo, &hi);
        const float d = h2f(&b->d);
        store_mul(dst, vsubq_s8(S8(lo), eight), d);
        store_mul(dst + 16, vsubq_s8(S8(hi), eight), d);
    }
}

void ei_deq_q4_1_neon(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        uint8x16_t lo, hi;
        nibbles(b->qs, &lo, &hi);
        const float d = h2f(&b->d), m = h2f(&b->m);
        store_mul_add(dst, S8(lo), d, m);
        store_mul_add(dst + 16, S8(hi), d, m);
    }
}

void ei_deq_q5_0_neon(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    const int8x16_t sixteen = vdupq_n_s8(16);
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        uint8x16_t lo, hi, h0, h1;
        nibbles(b->qs, &lo, &hi);
        qh_bits16(ei_ld32(b->qh), &h0, &h1);
        const float d = h2f(&b->d);
        store_mul(dst, vsubq_s8(S8(vorrq_u8(lo, h0)), sixteen), d);
        store_mul(dst + 16, vsubq_s8(S8(vorrq_u8(hi, h1)), sixteen), d);
    }
}

void ei_deq_q5_1_neon(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        uint8x16_t lo, hi, h0, h1;
        nibbles(b->qs, &lo, &hi);
        qh_bits16(ei_ld32(b->qh), &h0, &h1);
        const float d = h2f(&b->d), m = h2f(&b->m);
        store_mul_add(dst, S8(vorrq_u8(lo, h0)), d, m);
        store_mul_add(dst + 16, S8(vorrq_u8(hi, h1)), d, m);
    }
}

void ei_deq_q8_0_neon(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        const float d = h2f(&b->d);
        store_mul(dst, vld1q_s8(b->qs), d);
        store_mul(dst + 16, vld1q_s8(b->qs + 16), d);
    }
}

void ei_deq_q4_k_neon(const void *src, float *dst, int64_t n) {
    const block_q4_K *b = src;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qs = b->qs;
        for (int j = 0; j < 8; j += 2, dst += 64) {
            const uint8_t *q = qs + 16 * j;
            const uint8x16_t v0 = vld1q_u8(q), v1 = vld1q_u8(q + 16), m4 = vdupq_n_u8(0x0f);
            uint8_t sc, m;
            ei_k_scale_min(j, scales, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            store_mul_sub(dst, S8(vandq_u8(v0, m4)), dl, ml);
            store_mul_sub(dst + 16, S8(vandq_u8(v1, m4)), dl, ml);
            ei_k_scale_min(j + 1, scales, &sc, &m);
            dl = d * (float)sc;
            ml = dmin * (float)m;
            store_mul_sub(dst + 32, S8(vshrq_n_u8(v0, 4)), dl, ml);
            store_mul_sub(dst + 48, S8(vshrq_n_u8(v1, 4)), dl, ml);
        }
    }
}

void ei_deq_q5_k_neon(const void *src, float *dst, int64_t n) {
    const block_q5_K *b = src;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), b4 = vdupq_n_u8(16);
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qh = b->qh, *qs = b->qs;
        const uint8x16_t qh0 = vld1q_u8(qh), qh1 = vld1q_u8(qh + 16);
        for (int j = 0; j < 8; j++, dst += 32) {
            const uint8_t *q = qs + 32 * (j / 2);
            uint8x16_t v0 = vld1q_u8(q), v1 = vld1q_u8(q + 16);
            if (j & 1) {
                v0 = vshrq_n_u8(v0, 4);
                v1 = vshrq_n_u8(v1, 4);
            } else {
                v0 = vandq_u8(v0, m4);
                v1 = vandq_u8(v1, m4);
            }
            const uint8x16_t bj = vdupq_n_u8((uint8_t)(1u << j));
            v0 = vorrq_u8(v0, vandq_u8(vtstq_u8(qh0, bj), b4));
            v1 = vorrq_u8(v1, vandq_u8(vtstq_u8(qh1, bj), b4));
            uint8_t sc, m;
            ei_k_scale_min(j, scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            store_mul_sub(dst, S8(v0), dl, ml);
            store_mul_sub(dst + 16, S8(v1), dl, ml);
        }
    }
}

/* Q6_K values of activation block j (= 4h + k): elements 32j..32j+31 as two
 * vectors of 16 signed values (q - 32). */
static inline void q6k_block(const uint8_t *ql, const uint8_t *qh, int j, int8x16_t *w0, int8x16_t *w1) {
    const int h = j >> 2, k = j & 3;
    const uint8_t *L = ql + 64 * h + 32 * (k & 1), *H = qh + 32 * h;
    uint8x16_t l0 = vld1q_u8(L), l1 = vld1q_u8(L + 16);
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x30);
    if (k >> 1) {
        l0 = vshrq_n_u8(l0, 4);
        l1 = vshrq_n_u8(l1, 4);
    } else {
        l0 = vandq_u8(l0, m4);
        l1 = vandq_u8(l1, m4);
    }
    /* high 2 bits: (H >> 2k) & 3, moved to bits 4..5 */
    const int8x16_t sh = vdupq_n_s8((int8_t)(4 - 2 * k));
    const uint8x16_t h0 = vandq_u8(vshlq_u8(vld1q_u8(H), sh), m3);
    const uint8x16_t h1 = vandq_u8(vshlq_u8(vld1q_u8(H + 16), sh), m3);
    *w0 = vsubq_s8(S8(vorrq_u8(l0, h0)), vdupq_n_s8(32));
    *w1 = vsubq_s8(S8(vorrq_u8(l1, h1)), vdupq_n_s8(32));
}

void ei_deq_q6_k_neon(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const uint8_t *ql = b->ql, *qh = b->qh;
        const int8_t *sc = b->scales;
        const float d = h2f(&b->d);
        for (int j = 0; j < 8; j++, dst += 32) {
            int8x16_t w0, w1;
            q6k_block(ql, qh, j, &w0, &w1);
            store_mul(dst, w0, d * (float)sc[2 * j]);
            store_mul(dst + 16, w1, d * (float)sc[2 * j + 1]);
        }
    }
}

/* ---------------- activation quantization ---------------- */

void ei_quantize_act_neon(const float *x, int64_t n, ei_q8a *out) {
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float32x4_t v[8];
        float32x4_t mx = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(x + 4 * k);
            mx = vmaxq_f32(mx, vabsq_f32(v[k]));
        }
        const float amax = vmaxvq_f32(mx);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const float32x4_t vid = vdupq_n_f32(id);
        const int32x4_t hi = vdupq_n_s32(127), lo = vdupq_n_s32(-127);
        int32x4_t sum = vdupq_n_s32(0);
        int16x8_t h16[4];
        for (int k = 0; k < 8; k += 2) {
            /* round half to even, like lrintf in the default rounding mode */
            int32x4_t a = vcvtnq_s32_f32(vmulq_f32(v[k], vid));
            int32x4_t b = vcvtnq_s32_f32(vmulq_f32(v[k + 1], vid));
            a = vminq_s32(vmaxq_s32(a, lo), hi);
            b = vminq_s32(vmaxq_s32(b, lo), hi);
            sum = vaddq_s32(sum, vaddq_s32(a, b));
            h16[k / 2] = vcombine_s16(vmovn_s32(a), vmovn_s32(b));
        }
        vst1q_s8(out[i].q, vcombine_s8(vmovn_s16(h16[0]), vmovn_s16(h16[1])));
        vst1q_s8(out[i].q + 16, vcombine_s8(vmovn_s16(h16[2]), vmovn_s16(h16[3])));
        out[i].d = d;
        out[i].s = d * (float)vaddvq_s32(sum);
    }
}

/* ---------------- float dot products ---------------- */

float ei_dot_f32_neon(int64_t n, const void *row, const void *act) {
    const float *w = (const float *)row, *x = (const float *)act;
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vld1q_f32(w + i + 4), vld1q_f32(x + i + 4));
        a2 = vfmaq_f32(a2, vld1q_f32(w + i + 8), vld1q_f32(x + i + 8));
        a3 = vfmaq_f32(a3, vld1q_f32(w + i + 12), vld1q_f32(x + i + 12));
    }
    for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
    float acc = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) acc += w[i] * x[i];
    return acc;
}

float ei_dot_f16_neon(int64_t n, const void *row, const void *act) {
    const uint8_t *w = (const uint8_t *)row;
    const float *x = (const float *)act;
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const float16x8_t h0 = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)(w + 2 * i)));
        const float16x8_t h1 = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)(w + 2 * i + 16)));
        a0 = vfmaq_f32(a0, vcvt_f32_f16(vget_low_f16(h0)), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vcvt_high_f32_f16(h0), vld1q_f32(x + i + 4));
        a2 = vfmaq_f32(a2, vcvt_f32_f16(vget_low_f16(h1)), vld1q_f32(x + i + 8));
        a3 = vfmaq_f32(a3, vcvt_high_f32_f16(h1), vld1q_f32(x + i + 12));
    }
    float acc = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) acc += h2f(w + 2 * i) * x[i];
    return acc;
}

float ei_dot_bf16_neon(int64_t n, const void *row, const void *act) {
    const uint8_t *w = (const uint8_t *)row;
    const float *x = (const float *)act;
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const uint16x8_t v0 = vld1q_u16((const uint16_t *)(w + 2 * i));
        const uint16x8_t v1 = vld1q_u16((const uint16_t *)(w + 2 * i + 16));
        a0 = vfmaq_f32(a0, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v0), 16)), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vreinterpretq_f32_u32(vshll_high_n_u16(v0, 16)), vld1q_f32(x + i + 4));
        a2 = vfmaq_f32(a2, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v1), 16)), vld1q_f32(x + i + 8));
        a3 = vfmaq_f32(a3, vreinterpretq_f32_u32(vshll_high_n_u16(v1, 16)), vld1q_f32(x + i + 12));
    }
    float acc = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) {
        uint32_t bits = (uint32_t)ei_ld16(w + 2 * i) << 16;
        float f;
        memcpy(&f, &bits, 4);
        acc += f * x[i];
    }
    return acc;
}

/* ---------------- integer dot products: two builds ---------------- */

/* acc + the 16 products a[i]*b[i], summed into 4 lanes (plain ASIMD). */
static inline int32x4_t dot16_plain(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static inline int32x4_t dot16_dp(int32x4_t acc, int8x16_t a, int8x16_t b) {
    return vdotq_s32(acc, a, b);
}

#define EI_NEON_PASS 1
#define SFX neon
#define EI_DOTATTR
#define DOT16 dot16_plain
#include "quants_neon.c"
#undef SFX
#undef EI_DOTATTR
#undef DOT16
#undef EI_NEON_PASS

#define EI_NEON_PASS 2
#define SFX neondot
#define EI_DOTATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#define DOT16 dot16_dp
#include "quants_neon.c"
#undef SFX
#undef EI_DOTATTR
#undef DOT16
#undef EI_NEON_PASS

#endif /* __aarch64__ */

#else /* EI_NEON_PASS: integer dot kernels, instantiated per DOT16 / EI_DOTATTR / SFX */

#define EI_CAT_(a, b) a##b
#define EI_CAT(a, b) EI_CAT_(a, b)
#define FN(name) EI_CAT(EI_CAT(ei_dot_, name), EI_CAT(_, SFX))

/* integer inner product of 32 weights (w0: elements 0..15, w1: 16..31) with a block */
#define ISUM32(w0, w1, a) vaddvq_s32(DOT16(DOT16(vdupq_n_s32(0), (w0), vld1q_s8((a)->q)), (w1), vld1q_s8((a)->q + 16)))

EI_DOTATTR float FN(q8_0)(int64_t n, const void *row, const void *act) {
    const block_q8_0 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        const int isum = ISUM32(vld1q_s8(b->qs), vld1q_s8(b->qs + 16), a);
        acc += (h2f(&b->d) * a->d) * (float)isum;
    }
    return acc;
}

EI_DOTATTR float FN(q4_0)(int64_t n, const void *row, const void *act) {
    const block_q4_0 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const int8x16_t eight = vdupq_n_s8(8);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        uint8x16_t lo, hi;
        nibbles(b->qs, &lo, &hi);
        const int isum = ISUM32(vsubq_s8(S8(lo), eight), vsubq_s8(S8(hi), eight), a);
        acc += (h2f(&b->d) * a->d) * (float)isum;
    }
    return acc;
}

EI_DOTATTR float FN(q4_1)(int64_t n, const void *row, const void *act) {
    const block_q4_1 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        uint8x16_t lo, hi;
        nibbles(b->qs, &lo, &hi);
        const int isum = ISUM32(S8(lo), S8(hi), a);
        acc += (h2f(&b->d) * a->d) * (float)isum + h2f(&b->m) * a->s;
    }
    return acc;
}

EI_DOTATTR float FN(q5_0)(int64_t n, const void *row, const void *act) {
    const block_q5_0 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const int8x16_t sixteen = vdupq_n_s8(16);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        uint8x16_t lo, hi, h0, h1;
        nibbles(b->qs, &lo, &hi);
        qh_bits16(ei_ld32(b->qh), &h0, &h1);
        const int isum = ISUM32(vsubq_s8(S8(vorrq_u8(lo, h0)), sixteen), vsubq_s8(S8(vorrq_u8(hi, h1)), sixteen), a);
        acc += (h2f(&b->d) * a->d) * (float)isum;
    }
    return acc;
}

EI_DOTATTR float FN(q5_1)(int64_t n, const void *row, const void *act) {
    const block_q5_1 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        uint8x16_t lo, hi, h0, h1;
        nibbles(b->qs, &lo, &hi);
        qh_bits16(ei_ld32(b->qh), &h0, &h1);
        const int isum = ISUM32(S8(vorrq_u8(lo, h0)), S8(vorrq_u8(hi, h1)), a);
        acc += (h2f(&b->d) * a->d) * (float)isum + h2f(&b->m) * a->s;
    }
    return acc;
}

EI_DOTATTR float FN(q4_k)(int64_t n, const void *row, const void *act) {
    const block_q4_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qs = b->qs;
        for (int j = 0; j < 8; j += 2, a += 2) {
            const uint8_t *q = qs + 16 * j;
            const uint8x16_t v0 = vld1q_u8(q), v1 = vld1q_u8(q + 16);
            const int s0 = ISUM32(S8(vandq_u8(v0, m4)), S8(vandq_u8(v1, m4)), a);
            const int s1 = ISUM32(S8(vshrq_n_u8(v0, 4)), S8(vshrq_n_u8(v1, 4)), a + 1);
            uint8_t sc, m;
            ei_k_scale_min(j, scales, &sc, &m);
            acc += ((d * (float)sc) * a[0].d) * (float)s0 - (dmin * (float)m) * a[0].s;
            ei_k_scale_min(j + 1, scales, &sc, &m);
            acc += ((d * (float)sc) * a[1].d) * (float)s1 - (dmin * (float)m) * a[1].s;
        }
    }
    return acc;
}

EI_DOTATTR float FN(q5_k)(int64_t n, const void *row, const void *act) {
    const block_q5_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), b4 = vdupq_n_u8(16);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qh = b->qh, *qs = b->qs;
        const uint8x16_t qh0 = vld1q_u8(qh), qh1 = vld1q_u8(qh + 16);
        for (int j = 0; j < 8; j += 2, a += 2) {
            const uint8_t *q = qs + 16 * j;
            const uint8x16_t v0 = vld1q_u8(q), v1 = vld1q_u8(q + 16);
            const uint8x16_t be = vdupq_n_u8((uint8_t)(1u << j)), bo = vdupq_n_u8((uint8_t)(2u << j));
            const uint8x16_t e0 = vorrq_u8(vandq_u8(v0, m4), vandq_u8(vtstq_u8(qh0, be), b4));
            const uint8x16_t e1 = vorrq_u8(vandq_u8(v1, m4), vandq_u8(vtstq_u8(qh1, be), b4));
            const uint8x16_t o0 = vorrq_u8(vshrq_n_u8(v0, 4), vandq_u8(vtstq_u8(qh0, bo), b4));
            const uint8x16_t o1 = vorrq_u8(vshrq_n_u8(v1, 4), vandq_u8(vtstq_u8(qh1, bo), b4));
            const int s0 = ISUM32(S8(e0), S8(e1), a);
            const int s1 = ISUM32(S8(o0), S8(o1), a + 1);
            uint8_t sc, m;
            ei_k_scale_min(j, scales, &sc, &m);
            acc += ((d * (float)sc) * a[0].d) * (float)s0 - (dmin * (float)m) * a[0].s;
            ei_k_scale_min(j + 1, scales, &sc, &m);
            acc += ((d * (float)sc) * a[1].d) * (float)s1 - (dmin * (float)m) * a[1].s;
        }
    }
    return acc;
}

EI_DOTATTR float FN(q6_k)(int64_t n, const void *row, const void *act) {
    const block_q6_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const uint8_t *ql = b->ql, *qh = b->qh;
        const int8_t *sc = b->scales;
        const float d = h2f(&b->d);
        for (int j = 0; j < 8; j++, a++) {
            int8x16_t w0, w1;
            q6k_block(ql, qh, j, &w0, &w1);
            const int lo = vaddvq_s32(DOT16(vdupq_n_s32(0), w0, vld1q_s8(a->q)));
            const int hi = vaddvq_s32(DOT16(vdupq_n_s32(0), w1, vld1q_s8(a->q + 16)));
            acc += (d * a->d) * (float)(sc[2 * j] * lo + sc[2 * j + 1] * hi);
        }
    }
    return acc;
}

/* ---- the smaller types (kernels.c's SMALL_TYPES), in their GGUF layout: the scalar formulas, integer
 * parts exact, one float term (two for Q2_K) per activation block in the scalar order ---- */

EI_DOTATTR float FN(q2_k)(int64_t n, const void *row, const void *act) {
    const block_q2_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        for (int h = 0; h < 2; h++) {
            const uint8x16_t v0 = vld1q_u8(b->qs + 32 * h), v1 = vld1q_u8(b->qs + 32 * h + 16);
            for (int k = 0; k < 4; k++, a++) {
                const uint8_t *sc = b->scales + 8 * h + 2 * k;   /* the two halves of block 4h + k */
                uint8x16_t q0, q1;
                k2bits(v0, v1, k, &q0, &q1);
                /* sc_lo * isum_lo + sc_hi * isum_hi as one inner product: q * sc <= 45 fits a byte */
                const uint8x16_t w0 = vmulq_u8(q0, vdupq_n_u8(sc[0] & 15)), w1 = vmulq_u8(q1, vdupq_n_u8(sc[1] & 15));
                const int isum = ISUM32(S8(w0), S8(w1), a);
                /* m_lo * asum_lo + m_hi * asum_hi: the mins (<= 15) against the activations */
                const int msum = ISUM32(vdupq_n_s8((int8_t)(sc[0] >> 4)), vdupq_n_s8((int8_t)(sc[1] >> 4)), a);
                acc += (d * a->d) * (float)isum - (dmin * a->d) * (float)msum;
            }
        }
    }
    return acc;
}

EI_DOTATTR float FN(q3_k)(int64_t n, const void *row, const void *act) {
    const block_q3_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const uint8x16_t four = vdupq_n_u8(4);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d);
        int32_t sc[16];   /* -32..31: q * sc may reach 128, so the scales stay out of the bytes */
        for (int s = 0; s < 16; s++) sc[s] = ei_q3k_scale(b->scales, s);
        const uint8x16_t hm0 = vld1q_u8(b->hmask), hm1 = vld1q_u8(b->hmask + 16);
        for (int h = 0; h < 2; h++) {
            const uint8x16_t v0 = vld1q_u8(b->qs + 32 * h), v1 = vld1q_u8(b->qs + 32 * h + 16);
            for (int k = 0; k < 4; k++, a++) {
                const int j = 4 * h + k;
                uint8x16_t q0, q1;
                k2bits(v0, v1, k, &q0, &q1);
                /* bit j of hmask[l] clear: q - 4 (-4..3) */
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << j));
                const int8x16_t w0 = vsubq_s8(S8(q0), S8(vbicq_u8(four, vtstq_u8(hm0, bit))));
                const int8x16_t w1 = vsubq_s8(S8(q1), S8(vbicq_u8(four, vtstq_u8(hm1, bit))));
                const int32x4_t lo = DOT16(vdupq_n_s32(0), w0, vld1q_s8(a->q));
                const int32x4_t hi = DOT16(vdupq_n_s32(0), w1, vld1q_s8(a->q + 16));
                const int isum = vaddvq_s32(vmlaq_n_s32(vmulq_n_s32(lo, sc[2 * j]), hi, sc[2 * j + 1]));
                acc += (d * a->d) * (float)isum;
            }
        }
    }
    return acc;
}

EI_DOTATTR float FN(iq4_nl)(int64_t n, const void *row, const void *act) {
    const block_iq4_nl *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const int8x16_t table = vld1q_s8(ei_iq4nl_values);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        int8x16_t v0, v1;
        iq4_values(table, b->qs, &v0, &v1);
        const int isum = ISUM32(v0, v1, a);
        acc += (h2f(&b->d) * a->d) * (float)isum;
    }
    return acc;
}

EI_DOTATTR float FN(iq4_xs)(int64_t n, const void *row, const void *act) {
    const block_iq4_xs *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const int8x16_t table = vld1q_s8(ei_iq4nl_values);
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d);
        for (int s = 0; s < 8; s++, a++) {
            int8x16_t v0, v1;
            iq4_values(table, b->qs + 16 * s, &v0, &v1);
            const int isum = ISUM32(v0, v1, a);
            acc += (d * a->d) * (float)(ei_iq4xs_scale(b->scales_l, b->scales_h, s) * isum);
        }
    }
    return acc;
}

#undef ISUM32
#undef FN
#endif /* EI_NEON_PASS */
