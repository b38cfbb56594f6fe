/* Weight quantizers for the converter (float32 rows -> GGUF block formats).
 *
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: the reference rounding rules of ggml, bit-exact with the
 * `gguf` package's quants.py (float32 arithmetic, no fused multiply-add).
 * Q4_K, Q5_K: per 32-element sub-block, a weighted least-squares search over candidate
 * scales for (scale, min), then 6-bit quantization of the scales and mins against a fp16
 * super-block scale and a final re-rounding of every value with the scales as stored.
 * Q6_K: per 16-element sub-block, a magnitude-weighted search over candidate scales, 8-bit
 * sub-block scales against a fp16 super-block scale, then re-rounding as stored.
 * F16 / BF16 / F32: conversion with round-to-nearest-even.
 *
 * With an importance vector (one weight per column, an importance matrix's mean squared
 * activation) every search but Q8_0's minimizes the importance-weighted error instead, with
 * llama.cpp's weighting: Q4_0 / Q5_0 a symmetric weighted search, Q4_1 / Q5_1 the asymmetric
 * one; Q4_K / Q5_K weighted (scale, min) searches whose 6-bit sub-block scales are fitted by
 * weighted least squares too; Q6_K its 16-element searches weighted by the importance alone.
 *
 * Every function checks its arguments and returns an ei_status; none aborts. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"

#define QK 32
#define QKK 256
#define EPS_GROUP 1e-15f

/* Nearest integer, ties to even, for |v| < 2^22 (every value the fits round): adding 1.5 * 2^23
 * leaves the rounded integer in the mantissa. Plain float and integer operations, so the loops
 * around it vectorize (lrintf does not). */
static inline int round_int(float v) {
    float f = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}
static inline uint16_t h16(float f) { return ei_fp32_to_fp16(f); }
static inline float f16(uint16_t h) { return ei_fp16_to_fp32(h); }
static inline void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *the_min, float rmin, float rdelta, int nstep);
static float fit_scale_sym(int n, int nmax, const float *x, const float *w, uint8_t *L);
static void pack5(const int *q, uint8_t *qh, uint8_t *qs);

/* ------------------------------------------------------------------ legacy 32-blocks */

/* A 32-block of Q4_0 / Q5_0 (symmetric, nmax 8 / 16) or Q4_1 / Q5_1 (asymmetric, nmax
 * 15 / 31) fitted under importance weights qw * sqrt(sigma2 + x^2), sigma2 the row's mean
 * square: the columns an importance matrix marks keep more of their precision. */
static void legacy_weighted(const float *x, const float *qw, float sigma2, int nmax, int asym,
                            uint8_t *y) {
    float w[QK];
    uint8_t L[QK];
    for (int j = 0; j < QK; j++) w[j] = qw[j] * sqrtf(sigma2 + x[j] * x[j]);
    float d, mn = 0.0f;
    if (asym) {
        d = fit_scale_min(QK, nmax, x, w, L, &mn, -0.9f, 0.05f, 36);
        mn = -mn;
    } else {
        d = fit_scale_sym(QK, nmax, x, w, L);
    }
    put16(y, h16(d));
    if (asym) put16(y + 2, h16(mn));
    uint8_t *q = y + (asym ? 4 : 2);
    if (nmax < 16) {
        for (int j = 0; j < QK / 2; j++) q[j] = (uint8_t)(L[j] | (L[j + QK / 2] << 4));
    } else {
        int qi[QK];
        for (int j = 0; j < QK; j++) qi[j] = L[j];
        pack5(qi, q, q + 4);
    }
}

static void q8_0_block(const float *x, const float *qw, float sigma2, uint8_t *y) {
    (void)qw, (void)sigma2;   /* llama.cpp's Q8_0 ignores importance too */
    float amax = 0.0f;
    for (int i = 0; i < QK; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(y, h16(d));
    for (int i = 0; i < QK; i++) y[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
}

/* Signed max-magnitude element (first one on ties), as ggml picks it. */
static inline float signed_absmax(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < QK; i++) {
        float a = fabsf(x[i]);
        if (amax < a) { amax = a; max = x[i]; }
    }
    return max;
}

static void q4_0_block(const float *x, const float *qw, float sigma2, uint8_t *y) {
    if (qw) {
        legacy_weighted(x, qw, sigma2, 8, 0, y);
        return;
    }
    const float d = signed_absmax(x) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(y, h16(d));
    for (int j = 0; j < QK / 2; j++) {
        int a = (int)(x[j] * id + 8.5f), b = (int)(x[j + QK / 2] * id + 8.5f);
        if (a > 15) a = 15;
        if (b > 15) b = 15;
        y[2 + j] = (uint8_t)(a | (b << 4));
    }
}

static void q4_1_block(const float *x, const float *qw, float sigma2, uint8_t *y) {
    if (qw) {
        legacy_weighted(x, qw, sigma2, 15, 1, y);
        return;
    }
    float mn = x[0], mx = x[0];
    for (int i = 1; i < QK; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
    }
    const float d = (mx - mn) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(y, h16(d));
    put16(y + 2, h16(mn));
    for (int j = 0; j < QK / 2; j++) {
        int a = (int)((x[j] - mn) * id + 0.5f), b = (int)((x[j + QK / 2] - mn) * id + 0.5f);
        if (a > 15) a = 15;
        if (b > 15) b = 15;
        y[4 + j] = (uint8_t)(a | (b << 4));
    }
}

static void pack5(const int *q, uint8_t *qh, uint8_t *qs) {
    uint32_t h = 0;
    for (int j = 0; j < QK; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    memcpy(qh, &h, 4); /* little-endian hosts only (x86, arm64) */
    for (int j = 0; j < QK / 2; j++) qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + QK / 2] & 0xF) << 4));
}

static void q5_0_block(const float *x, const float *qw, float sigma2, uint8_t *y) {
    if (qw) {
        legacy_weighted(x, qw, sigma2, 16, 0, y);
        return;
    }
    const float d = signed_absmax(x) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[QK];
    for (int i = 0; i < QK; i++) {
        int v = (int)(x[i] * id + 16.5f);
        q[i] = v > 31 ? 31 : v;
    }
    put16(y, h16(d));
    pack5(q, y + 2, y + 6);
}

static void q5_1_block(const float *x, const float *qw, float sigma2, uint8_t *y) {
    if (qw) {
        legacy_weighted(x, qw, sigma2, 31, 1, y);
        return;
    }
    float mn = x[0], mx = x[0];
    for (int i = 1; i < QK; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
    }
    const float d = (mx - mn) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[QK];
    for (int i = 0; i < QK; i++) {
        int v = (int)((x[i] - mn) * id + 0.5f);
        q[i] = v > 31 ? 31 : v;
    }
    put16(y, h16(d));
    put16(y + 2, h16(mn));
    pack5(q, y + 4, y + 8);
}

/* ------------------------------------------------------------------ K-quant helpers */

/* Asymmetric fit x ~= scale * L - mn (L in [0, nmax]) minimizing sum w (x - fit)^2 over a
 * set of candidate inverse scales; returns scale, stores mn (>= 0) and L. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *the_min, float rmin, float rdelta, int nstep) {
    float mn = x[0], mx = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (mn > 0) mn = 0;
    if (mx == mn) {
        memset(L, 0, (size_t)n);
        *the_min = -mn;
        return 0.0f;
    }
    float iscale = nmax / (mx - mn);
    float scale = 1.0f / iscale;
    float best = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = round_int(iscale * (x[i] - mn));
        l = l < 0 ? 0 : (l > nmax ? nmax : l);
        L[i] = (uint8_t)l;
        float diff = scale * l + mn - x[i];
        best += w[i] * (diff * diff);
    }
    uint8_t Laux[QK];
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (mx - mn);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = round_int(iscale * (x[i] - mn));
            l = l < 0 ? 0 : (l > nmax ? nmax : l);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if (err < best) {
                memcpy(L, Laux, (size_t)n);
                best = err;
                scale = this_scale;
                mn = this_min;
            }
        }
    }
    *the_min = -mn;
    return scale;
}

/* Symmetric fit x ~= scale * (L - nmax), L - nmax in [-nmax, nmax - 1], weights w (NULL:
 * x^2), searching inverse scales around nmax / max. */
static float fit_scale_sym(int n, int nmax, const float *x, const float *w, uint8_t *L) {
    float mx = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; mx = x[i]; }
    }
    if (amax < EPS_GROUP) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = -nmax / mx;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = round_int(iscale * x[i]);
        l = l < -nmax ? -nmax : (l > nmax - 1 ? nmax - 1 : l);
        L[i] = (uint8_t)(l + nmax);
        const float wi = w ? w[i] : x[i] * x[i];
        sumlx += wi * x[i] * l;
        suml2 += wi * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / mx;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = round_int(iscale * x[i]);
            l = l < -nmax ? -nmax : (l > nmax - 1 ? nmax - 1 : l);
            const float wi = w ? w[i] : x[i] * x[i];
            sumlx += wi * x[i] * l;
            suml2 += wi * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = round_int(iscale * x[i]);
                l = l < -nmax ? -nmax : (l > nmax - 1 ? nmax - 1 : l);
                L[i] = (uint8_t)(l + nmax);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Fit of non-negative x ~= scale * L, L in [0, nmax], minimizing sum w (x - scale L)^2:
 * a search over inverse scales, then up to five passes moving single L's while the
 * weighted fit improves. Quantizes a super-block's sub-block scales or mins. */
static float fit_pos_scale(int n, int nmax, const float *x, const float *w, uint8_t *L) {
    float max = 0;
    for (int i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    if (max < EPS_GROUP) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)round_int(iscale * x[i]);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        float diff = x[i] - scale * L[i];
        best += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * is + nmax) / max, scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; i++) {
            int l = round_int(iscale_is * x[i]);
            l = l < nmax ? l : nmax;
            float diff = x[i] - scale_is * l;
            mse += w[i] * diff * diff;
        }
        if (mse < best) {
            best = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = round_int(iscale * x[i]);
        l = l < nmax ? l : nmax;
        L[i] = (uint8_t)l;
        sumlx += w[i] * x[i] * l;
        suml2 += w[i] * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sumlx - w[i] * x[i] * L[i];
            float sl2 = suml2 - w[i] * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = round_int(x[i] * sl2 / slx);
                new_l = new_l < nmax ? new_l : nmax;
                if (new_l != L[i]) {
                    slx += w[i] * x[i] * new_l;
                    sl2 += w[i] * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static inline void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Writes a Q4_K / Q5_K super-block's 12 scale bytes from 6-bit sub-block scales Ls and mins
 * Lm, its fp16 d and dmin, then re-rounds every value (L, 0..nmax) with the scales as stored. */
static void k_store_scales(const float *x, int nmax, const uint8_t *Ls, const uint8_t *Lm,
                           float d_block, float m_block, uint8_t *dd, uint8_t *sc12, uint8_t *L) {
    memset(sc12, 0, 12);
    for (int j = 0; j < 8; j++) {
        const int ls = Ls[j], lm = Lm[j];
        if (j < 4) {
            sc12[j] = (uint8_t)ls;
            sc12[j + 4] = (uint8_t)lm;
        } else {
            sc12[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc12[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc12[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    uint16_t hd = h16(d_block), hm = h16(m_block);
    put16(dd, hd);
    put16(dd + 2, hm);
    const float D = f16(hd), DM = f16(hm);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        scale_min_k4(j, sc12, &sc, &m);
        const float d = D * sc;
        if (d == 0.0f) continue;
        const float dm = DM * m;
        for (int ii = 0; ii < QK; ii++) {
            int l = round_int((x[QK * j + ii] + dm) / d);
            L[QK * j + ii] = (uint8_t)(l < 0 ? 0 : (l > nmax ? nmax : l));
        }
    }
}

/* Shared body of Q4_K / Q5_K: fills d, dmin, the 12 scale bytes and L (0..nmax). Without
 * importance: magnitude-weighted (scale, min) searches, the scales rounded against their
 * maximum; with it: importance-weighted searches and weighted fits of the scales. */
static void k_scales_mins(const float *x, const float *qw, int nmax, float rmin, int nstep,
                          uint8_t *dd, uint8_t *sc12, uint8_t *L) {
    float scales[8], mins[8], w[QK], sw[8];
    uint8_t Ls[8], Lm[8];
    if (qw) {
        float sum_x2 = 0;
        for (int l = 0; l < QKK; l++) sum_x2 += x[l] * x[l];
        const float sigma2 = 2 * sum_x2 / QKK;
        for (int j = 0; j < 8; j++) {
            const float *xb = x + QK * j;
            float sumw = 0;
            for (int l = 0; l < QK; l++) w[l] = qw[QK * j + l] * sqrtf(sigma2 + xb[l] * xb[l]);
            for (int l = 0; l < QK; l++) sumw += w[l];
            sw[j] = sumw;
            scales[j] = fit_scale_min(QK, nmax, xb, w, L + QK * j, &mins[j], -0.9f, 0.05f, 36);
        }
        const float d_block = fit_pos_scale(8, 63, scales, sw, Ls);
        const float m_block = fit_pos_scale(8, 63, mins, sw, Lm);
        if (nmax == 31) {   /* Q5_K's scales are clamped to 6 bits; Q4_K's are not (llama.cpp) */
            for (int j = 0; j < 8; j++) {
                Ls[j] = Ls[j] > 63 ? 63 : Ls[j];
                Lm[j] = Lm[j] > 63 ? 63 : Lm[j];
            }
        }
        k_store_scales(x, nmax, Ls, Lm, d_block, m_block, dd, sc12, L);
        return;
    }
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xb = x + QK * j;
        float sum_x2 = 0;
        for (int l = 0; l < QK; l++) sum_x2 += xb[l] * xb[l];
        float av_x = sqrtf(sum_x2 / QK);
        for (int l = 0; l < QK; l++) w[l] = av_x + fabsf(xb[l]);
        scales[j] = fit_scale_min(QK, nmax, xb, w, L + QK * j, &mins[j], rmin, 0.1f, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < 8; j++) {
        int ls = round_int(inv_scale * scales[j]), lm = round_int(inv_min * mins[j]);
        Ls[j] = (uint8_t)(ls > 63 ? 63 : ls);
        Lm[j] = (uint8_t)(lm > 63 ? 63 : lm);
    }
    k_store_scales(x, nmax, Ls, Lm, max_scale / 63.0f, max_min / 63.0f, dd, sc12, L);
}

static void q4_k_block(const float *x, const float *qw, float sigma2, uint8_t *y) {
    (void)sigma2;   /* the K-quants weigh by their super-block's own mean square */
    uint8_t L[QKK];
    k_scales_mins(x, qw, 15, -1.0f, 20, y, y + 4, L);
    uint8_t *q = y + 16;
    for (int j = 0; j < QKK; j += 64) {
        for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        q += 32;
    }
}

static void q5_k_block(const float *x, const float *qw, float sigma2, uint8_t *y) {
    (void)sigma2;
    uint8_t L[QKK];
    k_scales_mins(x, qw, 31, -0.5f, 15, y, y + 4, L);
    uint8_t *qh = y + 16, *ql = y + 48;
    memset(qh, 0, 32);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QKK; n += 64) {
        for (int j = 0; j < 32; j++) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) { l1 -= 16; qh[j] |= m1; }
            if (l2 > 15) { l2 -= 16; qh[j] |= m2; }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 <<= 2;
        m2 <<= 2;
        ql += 32;
    }
}

static void q6_k_block(const float *x, const float *qw, float sigma2, uint8_t *y) {
    (void)sigma2;
    uint8_t L[QKK];
    float scales[16];
    float max_scale = 0, max_abs = 0;
    for (int ib = 0; ib < 16; ib++) {
        scales[ib] = fit_scale_sym(16, 32, x + 16 * ib, qw ? qw + 16 * ib : NULL, L + 16 * ib);
        float a = fabsf(scales[ib]);
        if (a > max_abs) { max_abs = a; max_scale = scales[ib]; }
    }
    uint8_t *ql = y, *qh = y + 128;
    int8_t *sc = (int8_t *)(y + 192);
    if (max_abs < EPS_GROUP) {
        memset(y, 0, 210);
        return;
    }
    const float iscale = -128.0f / max_scale;
    const uint16_t hd = h16(1.0f / iscale);
    put16(y + 208, hd);
    for (int ib = 0; ib < 16; ib++) {
        int v = round_int(iscale * scales[ib]);
        sc[ib] = (int8_t)(v > 127 ? 127 : v);
    }
    const float D = f16(hd);
    for (int j = 0; j < 16; j++) {
        const float d = D * sc[j];
        if (d == 0.0f) continue;
        for (int ii = 0; ii < 16; ii++) {
            int l = round_int(x[16 * j + ii] / d);
            l = l < -32 ? -32 : (l > 31 ? 31 : l);
            L[16 * j + ii] = (uint8_t)(l + 32);
        }
    }
    for (int j = 0; j < QKK; j += 128) {
        for (int l = 0; l < 32; l++) {
            const uint8_t q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
            ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
            ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
            qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
        }
        ql += 64;
        qh += 32;
    }
}

/* ------------------------------------------------------------------ float types */

static void f16_row(const float *x, uint8_t *y, int64_t n) {
    uint16_t *o = (uint16_t *)y;
    for (int64_t i = 0; i < n; i++) o[i] = h16(x[i]);
}

static void bf16_row(const float *x, uint8_t *y, int64_t n) {
    uint16_t *o = (uint16_t *)y;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN: keep it quiet */
            o[i] = (uint16_t)((u >> 16) | 64);
            continue;
        }
        o[i] = (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
    }
}

/* ------------------------------------------------------------------ dispatch */

/* One block from x; qw: the block's importance (NULL: none), sigma2: the row's mean square. */
typedef void (*block_fn)(const float *x, const float *qw, float sigma2, uint8_t *y);

static int block_info(int type, block_fn *fn, int *be, int *bb) {
    switch (type) {
    case EI_TYPE_Q8_0: *fn = q8_0_block; *be = 32; *bb = 34; return 1;
    case EI_TYPE_Q4_0: *fn = q4_0_block; *be = 32; *bb = 18; return 1;
    case EI_TYPE_Q4_1: *fn = q4_1_block; *be = 32; *bb = 20; return 1;
    case EI_TYPE_Q5_0: *fn = q5_0_block; *be = 32; *bb = 22; return 1;
    case EI_TYPE_Q5_1: *fn = q5_1_block; *be = 32; *bb = 24; return 1;
    case EI_TYPE_Q4_K: *fn = q4_k_block; *be = 256; *bb = 144; return 1;
    case EI_TYPE_Q5_K: *fn = q5_k_block; *be = 256; *bb = 176; return 1;
    case EI_TYPE_Q6_K: *fn = q6_k_block; *be = 256; *bb = 210; return 1;
    case EI_TYPE_F32: *fn = NULL; *be = 1; *bb = 4; return 1;
    case EI_TYPE_F16: *fn = NULL; *be = 1; *bb = 2; return 1;
    case EI_TYPE_BF16: *fn = NULL; *be = 1; *bb = 2; return 1;
    default: return 0;
    }
}

typedef struct {
    int type;
    block_fn fn;
    int be, bb;
    const float *src, *importance;
    uint8_t *dst;
    int64_t r0, r1, n_cols;
} qjob;

static void run_rows(const qjob *j) {
    const int64_t row_bytes = j->n_cols / j->be * j->bb;
    for (int64_t r = j->r0; r < j->r1; r++) {
        const float *x = j->src + r * j->n_cols;
        uint8_t *y = j->dst + r * row_bytes;
        if (j->type == EI_TYPE_F32) {
            memcpy(y, x, (size_t)j->n_cols * 4);
        } else if (j->type == EI_TYPE_F16) {
            f16_row(x, y, j->n_cols);
        } else if (j->type == EI_TYPE_BF16) {
            bf16_row(x, y, j->n_cols);
        } else {
            const float *qw = j->importance;
            float sigma2 = 0;
            if (qw) {
                float sum_x2 = 0;
                for (int64_t i = 0; i < j->n_cols; i++) sum_x2 += x[i] * x[i];
                sigma2 = sum_x2 / j->n_cols;
            }
            for (int64_t b = 0; b < j->n_cols / j->be; b++)
                j->fn(x + b * j->be, qw ? qw + b * j->be : NULL, sigma2, y + b * j->bb);
        }
    }
}

static void *run_rows_thread(void *arg) {
    run_rows((const qjob *)arg);
    return NULL;
}

ei_status ei_quantize_row_bytes(int type, int64_t n_cols, int64_t *out) {
    block_fn fn;
    int be, bb;
    if (!out) return ei_fail(EI_ERR_INVALID_ARG, "ei_quantize_row_bytes: out is NULL");
    if (!block_info(type, &fn, &be, &bb))
        return ei_fail(EI_ERR_UNSUPPORTED, "cannot quantize to GGML type %d", type);
    if (n_cols <= 0 || n_cols % be)
        return ei_fail(EI_ERR_INVALID_ARG, "row length %lld is not a positive multiple of %d",
                       (long long)n_cols, be);
    *out = n_cols / be * bb;
    return EI_OK;
}

ei_status ei_quantize_rows(int type, const float *src, void *dst, int64_t n_rows, int64_t n_cols,
                           const float *importance, int n_threads) {
    block_fn fn;
    int be, bb;
    if (!src || !dst) return ei_fail(EI_ERR_INVALID_ARG, "ei_quantize_rows: NULL buffer");
    if (!block_info(type, &fn, &be, &bb))
        return ei_fail(EI_ERR_UNSUPPORTED, "cannot quantize to GGML type %d", type);
    if (n_rows < 0 || n_cols <= 0 || n_cols % be)
        return ei_fail(EI_ERR_INVALID_ARG,
                       "ei_quantize_rows: %lld rows of %lld: row length must be a positive "
                       "multiple of %d", (long long)n_rows, (long long)n_cols, be);
    if (importance) {
        for (int64_t i = 0; i < n_cols; i++)
            if (!(importance[i] >= 0.0f) || isinf(importance[i]))
                return ei_fail(EI_ERR_INVALID_ARG, "ei_quantize_rows: importance[%lld] = %g is not "
                               "a finite value >= 0", (long long)i, (double)importance[i]);
    }
    if (n_rows == 0) return EI_OK;
    if (n_threads <= 0) n_threads = ei_physical_cores();
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    /* at least ~64K elements per thread, or threads cost more than they give */
    int64_t max_t = (n_rows * n_cols) / 65536;
    if (max_t < 1) max_t = 1;
    if (n_threads > max_t) n_threads = (int)max_t;
    if (n_threads > n_rows) n_threads = (int)n_rows;

    qjob jobs[256];
    pthread_t th[256];
    int started[256] = {0};
    for (int t = 0; t < n_threads; t++) {
        jobs[t] = (qjob){type, fn, be, bb, src, importance, (uint8_t *)dst, n_rows * t / n_threads,
                         n_rows * (t + 1) / n_threads, n_cols};
    }
    for (int t = 1; t < n_threads; t++)
        started[t] = pthread_create(&th[t], NULL, run_rows_thread, &jobs[t]) == 0;
    run_rows(&jobs[0]);
    for (int t = 1; t < n_threads; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else run_rows(&jobs[t]); /* could not start a thread: do its share here */
    }
    return EI_OK;
}
