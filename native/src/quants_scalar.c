/* Scalar reference kernels: the oracle every SIMD kernel is checked against.
 *
 * Dequantization rounds exactly as gguf.quants does in float32 (no FMA).
 * Dot products: integer inner products inside each 32-element activation
 * block, float across blocks:
 *   Q8_0/Q4_0/Q5_0: sum_b (d_w * d_a) * isum_b
 *   Q4_1/Q5_1:      sum_b (d_w * d_a) * isum_b + m_w * s_a
 *   Q4_K/Q5_K:      sum_j ((d * sc_j) * d_a) * isum_j - (dmin * m_j) * s_a
 *   Q6_K:           sum_b (d * d_a) * (sc_lo * isum_lo + sc_hi * isum_hi)
 *   Q3_K:           the same, sc the 6-bit scales minus 32
 *   Q2_K:           sum_b (d * d_a) * (sc_lo * isum_lo + sc_hi * isum_hi)
 *                         - (dmin * d_a) * (m_lo * asum_lo + m_hi * asum_hi)
 *                   (asum: the sum of the activation quants of a 16-element half)
 *   IQ4_NL:         sum_b (d_w * d_a) * isum_b (isum over the table's values)
 *   IQ4_XS:         sum_b (d * d_a) * (sc_b * isum_b)
 */
#include <math.h>

#include "quants_impl.h"

/* ---------------- dequantization ---------------- */

EI_NO_CONTRACT void ei_deq_f32_scalar(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

EI_NO_CONTRACT void ei_deq_f16_scalar(const void *src, float *dst, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = ei_h2f(ei_ld16(s + 2 * i));
}

EI_NO_CONTRACT void ei_deq_bf16_scalar(const void *src, float *dst, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)ei_ld16(s + 2 * i) << 16;
        memcpy(dst + i, &b, 4);
    }
}

EI_NO_CONTRACT void ei_deq_q4_0_scalar(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        const float d = ei_h2f(b->d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)((b->qs[j] & 15) - 8);
            dst[j + 16] = d * (float)((b->qs[j] >> 4) - 8);
        }
    }
}

EI_NO_CONTRACT void ei_deq_q4_1_scalar(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        const float d = ei_h2f(b->d), m = ei_h2f(b->m);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)(b->qs[j] & 15) + m;
            dst[j + 16] = d * (float)(b->qs[j] >> 4) + m;
        }
    }
}

EI_NO_CONTRACT void ei_deq_q5_0_scalar(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        const float d = ei_h2f(b->d);
        const uint32_t qh = ei_ld32(b->qh);
        const uint8_t *qs = b->qs;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            dst[j] = d * (float)(lo - 16);
            dst[j + 16] = d * (float)(hi - 16);
        }
    }
}

EI_NO_CONTRACT void ei_deq_q5_1_scalar(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        const float d = ei_h2f(b->d), m = ei_h2f(b->m);
        const uint32_t qh = ei_ld32(b->qh);
        const uint8_t *qs = b->qs;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            dst[j] = d * (float)lo + m;
            dst[j + 16] = d * (float)hi + m;
        }
    }
}

EI_NO_CONTRACT void ei_deq_q8_0_scalar(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        const float d = ei_h2f(b->d);
        for (int j = 0; j < QK; j++) dst[j] = (float)b->qs[j] * d;
    }
}

EI_NO_CONTRACT void ei_deq_q4_k_scalar(const void *src, float *dst, int64_t n) {
    const block_q4_K *b = src;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = ei_h2f(b->d), dmin = ei_h2f(b->dmin);
        for (int j = 0; j < 8; j++, dst += 32) {
            uint8_t sc, m;
            ei_k_scale_min(j, b->scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            for (int l = 0; l < 32; l++) dst[l] = dl * (float)((q[l] >> shift) & 15) - ml;
        }
    }
}

EI_NO_CONTRACT void ei_deq_q5_k_scalar(const void *src, float *dst, int64_t n) {
    const block_q5_K *b = src;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = ei_h2f(b->d), dmin = ei_h2f(b->dmin);
        for (int j = 0; j < 8; j++, dst += 32) {
            uint8_t sc, m;
            ei_k_scale_min(j, b->scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = b->qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 15) | (((b->qh[l] >> j) & 1) << 4);
                dst[l] = dl * (float)v - ml;
            }
        }
    }
}

/* 6-bit value of element e (0..255) of a Q6_K block, unsigned (0..63). */
static inline int q6k_u(const uint8_t *ql, const uint8_t *qh, int e) {
    int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
    int lo = (ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
    int hi = (qh[32 * h + l] >> (2 * k)) & 3;
    return lo | (hi << 4);
}

EI_NO_CONTRACT void ei_deq_q6_k_scalar(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QKK; i++, b++, dst += QKK) {
        const float d = ei_h2f(b->d);
        for (int s = 0; s < 16; s++) {
            const float dl = d * (float)b->scales[s];
            for (int l = 0; l < 16; l++) {
                int e = 16 * s + l;
                dst[e] = dl * (float)(q6k_u(b->ql, b->qh, e) - 32);
            }
        }
    }
}

EI_NO_CONTRACT void ei_deq_q2_k_scalar(const void *src, float *dst, int64_t n) {
    const block_q2_K *b = src;
    for (int64_t i = 0; i < n / QKK; i++, b++, dst += QKK) {
        const float d = ei_h2f(b->d), dmin = ei_h2f(b->dmin);
        for (int e = 0; e < QKK; e++) {
            const int s = e / 16, q = (b->qs[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3;
            const float dl = d * (float)(b->scales[s] & 15), ml = dmin * (float)(b->scales[s] >> 4);
            dst[e] = dl * (float)q - ml;
        }
    }
}

/* Q3_K quant of element e (-4..3) */
static inline int q3k_q(const block_q3_K *b, int e) {
    const int h = e / 128, k = e / 32 % 4, l = e % 32;
    const int lo = (b->qs[32 * h + l] >> (2 * k)) & 3;
    return lo - ((b->hmask[l] >> (4 * h + k)) & 1 ? 0 : 4);
}

EI_NO_CONTRACT void ei_deq_q3_k_scalar(const void *src, float *dst, int64_t n) {
    const block_q3_K *b = src;
    for (int64_t i = 0; i < n / QKK; i++, b++, dst += QKK) {
        const float d = ei_h2f(b->d);
        for (int e = 0; e < QKK; e++) dst[e] = (d * (float)ei_q3k_scale(b->scales, e / 16)) * (float)q3k_q(b, e);
    }
}

EI_NO_CONTRACT void ei_deq_iq4_nl_scalar(const void *src, float *dst, int64_t n) {
    const block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        const float d = ei_h2f(b->d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)ei_iq4nl_values[b->qs[j] & 15];
            dst[j + 16] = d * (float)ei_iq4nl_values[b->qs[j] >> 4];
        }
    }
}

EI_NO_CONTRACT void ei_deq_iq4_xs_scalar(const void *src, float *dst, int64_t n) {
    const block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = ei_h2f(b->d);
        for (int s = 0; s < 8; s++, dst += 32) {
            const float dl = d * (float)ei_iq4xs_scale(b->scales_l, b->scales_h, s);
            const uint8_t *qs = b->qs + 16 * s;
            for (int j = 0; j < 16; j++) {
                dst[j] = dl * (float)ei_iq4nl_values[qs[j] & 15];
                dst[j + 16] = dl * (float)ei_iq4nl_values[qs[j] >> 4];
            }
        }
    }
}

/* ---------------- activation quantization ---------------- */

void ei_quantize_act_scalar(const float *x, int64_t n, ei_q8a *out) {
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            float a = fabsf(x[j]);
            amax = a > amax ? a : amax;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            /* round half to even (the current rounding mode), as cvtps2dq does */
            long v = lrintf(x[j] * id);
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            out[i].q[j] = (int8_t)v;
            sum += (int)v;
        }
        out[i].d = d;
        out[i].s = d * (float)sum;
    }
}

/* ---------------- dot products ---------------- */

float ei_dot_f32_scalar(int64_t n, const void *row, const void *act) {
    const float *w = (const float *)row, *x = (const float *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += w[i] * x[i];
    return acc;
}

float ei_dot_f16_scalar(int64_t n, const void *row, const void *act) {
    const uint8_t *w = (const uint8_t *)row;
    const float *x = (const float *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += ei_h2f(ei_ld16(w + 2 * i)) * x[i];
    return acc;
}

float ei_dot_bf16_scalar(int64_t n, const void *row, const void *act) {
    const uint8_t *w = (const uint8_t *)row;
    const float *x = (const float *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)ei_ld16(w + 2 * i) << 16;
        float f;
        memcpy(&f, &b, 4);
        acc += f * x[i];
    }
    return acc;
}

float ei_dot_q8_0_scalar(int64_t n, const void *row, const void *act) {
    const block_q8_0 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        int isum = 0;
        for (int j = 0; j < QK; j++) isum += b->qs[j] * a->q[j];
        acc += (ei_h2f(b->d) * a->d) * (float)isum;
    }
    return acc;
}

float ei_dot_q4_0_scalar(int64_t n, const void *row, const void *act) {
    const block_q4_0 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        const uint8_t *qs = b->qs;
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += ((qs[j] & 15) - 8) * a->q[j] + ((qs[j] >> 4) - 8) * a->q[j + 16];
        acc += (ei_h2f(b->d) * a->d) * (float)isum;
    }
    return acc;
}

float ei_dot_q4_1_scalar(int64_t n, const void *row, const void *act) {
    const block_q4_1 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        const uint8_t *qs = b->qs;
        int isum = 0;
        for (int j = 0; j < 16; j++) isum += (qs[j] & 15) * a->q[j] + (qs[j] >> 4) * a->q[j + 16];
        acc += (ei_h2f(b->d) * a->d) * (float)isum + ei_h2f(b->m) * a->s;
    }
    return acc;
}

float ei_dot_q5_0_scalar(int64_t n, const void *row, const void *act) {
    const block_q5_0 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        const uint32_t qh = ei_ld32(b->qh);
        const uint8_t *qs = b->qs;
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += (lo - 16) * a->q[j] + (hi - 16) * a->q[j + 16];
        }
        acc += (ei_h2f(b->d) * a->d) * (float)isum;
    }
    return acc;
}

float ei_dot_q5_1_scalar(int64_t n, const void *row, const void *act) {
    const block_q5_1 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        const uint32_t qh = ei_ld32(b->qh);
        const uint8_t *qs = b->qs;
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += lo * a->q[j] + hi * a->q[j + 16];
        }
        acc += (ei_h2f(b->d) * a->d) * (float)isum + ei_h2f(b->m) * a->s;
    }
    return acc;
}

float ei_dot_q4_k_scalar(int64_t n, const void *row, const void *act) {
    const block_q4_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = ei_h2f(b->d), dmin = ei_h2f(b->dmin);
        for (int j = 0; j < 8; j++, a++) {
            uint8_t sc, m;
            ei_k_scale_min(j, b->scales, &sc, &m);
            const uint8_t *q = b->qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            int isum = 0;
            for (int l = 0; l < 32; l++) isum += ((q[l] >> shift) & 15) * a->q[l];
            acc += ((d * (float)sc) * a->d) * (float)isum - (dmin * (float)m) * a->s;
        }
    }
    return acc;
}

float ei_dot_q5_k_scalar(int64_t n, const void *row, const void *act) {
    const block_q5_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = ei_h2f(b->d), dmin = ei_h2f(b->dmin);
        for (int j = 0; j < 8; j++, a++) {
            uint8_t sc, m;
            ei_k_scale_min(j, b->scales, &sc, &m);
            const uint8_t *q = b->qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            int isum = 0;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 15) | (((b->qh[l] >> j) & 1) << 4);
                isum += v * a->q[l];
            }
            acc += ((d * (float)sc) * a->d) * (float)isum - (dmin * (float)m) * a->s;
        }
    }
    return acc;
}

float ei_dot_q6_k_scalar(int64_t n, const void *row, const void *act) {
    const block_q6_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const int8_t *sc = b->scales;
        const float d = ei_h2f(b->d);
        for (int j = 0; j < 8; j++, a++) {
            /* activation block j: elements 32j..32j+31 (see blocks.h) */
            const int h = j >> 2, k = j & 3, sl = 4 * (k >> 1), sh = 2 * k;
            const uint8_t *L = b->ql + 64 * h + 32 * (k & 1), *H = b->qh + 32 * h;
            int lo = 0, hi = 0;
            for (int l = 0; l < 16; l++) {
                lo += ((((L[l] >> sl) & 15) | (((H[l] >> sh) & 3) << 4)) - 32) * a->q[l];
                hi += ((((L[l + 16] >> sl) & 15) | (((H[l + 16] >> sh) & 3) << 4)) - 32) * a->q[l + 16];
            }
            acc += (d * a->d) * (float)(sc[2 * j] * lo + sc[2 * j + 1] * hi);
        }
    }
    return acc;
}

float ei_dot_q2_k_scalar(int64_t n, const void *row, const void *act) {
    const block_q2_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = ei_h2f(b->d), dmin = ei_h2f(b->dmin);
        for (int j = 0; j < 8; j++, a++) {
            const uint8_t *q = b->qs + 32 * (j >> 2), *sc = b->scales + 2 * j;
            const int shift = 2 * (j & 3);
            int isum[2] = {0, 0}, asum[2] = {0, 0};
            for (int l = 0; l < 32; l++) {
                isum[l / 16] += ((q[l] >> shift) & 3) * a->q[l];
                asum[l / 16] += a->q[l];
            }
            acc += (d * a->d) * (float)((sc[0] & 15) * isum[0] + (sc[1] & 15) * isum[1]) -
                   (dmin * a->d) * (float)((sc[0] >> 4) * asum[0] + (sc[1] >> 4) * asum[1]);
        }
    }
    return acc;
}

float ei_dot_q3_k_scalar(int64_t n, const void *row, const void *act) {
    const block_q3_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = ei_h2f(b->d);
        for (int j = 0; j < 8; j++, a++) {
            int isum[2] = {0, 0};
            for (int l = 0; l < 32; l++) isum[l / 16] += q3k_q(b, 32 * j + l) * a->q[l];
            acc += (d * a->d) * (float)(ei_q3k_scale(b->scales, 2 * j) * isum[0] +
                                        ei_q3k_scale(b->scales, 2 * j + 1) * isum[1]);
        }
    }
    return acc;
}

float ei_dot_iq4_nl_scalar(int64_t n, const void *row, const void *act) {
    const block_iq4_nl *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += ei_iq4nl_values[b->qs[j] & 15] * a->q[j] + ei_iq4nl_values[b->qs[j] >> 4] * a->q[j + 16];
        acc += (ei_h2f(b->d) * a->d) * (float)isum;
    }
    return acc;
}

float ei_dot_iq4_xs_scalar(int64_t n, const void *row, const void *act) {
    const block_iq4_xs *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = ei_h2f(b->d);
        for (int s = 0; s < 8; s++, a++) {
            const uint8_t *qs = b->qs + 16 * s;
            int isum = 0;
            for (int j = 0; j < 16; j++)
                isum += ei_iq4nl_values[qs[j] & 15] * a->q[j] + ei_iq4nl_values[qs[j] >> 4] * a->q[j + 16];
            acc += (d * a->d) * (float)(ei_iq4xs_scale(b->scales_l, b->scales_h, s) * isum);
        }
    }
    return acc;
}
