/* AVX2 kernels (x86-64 only; chosen at run time when avx2+fma+f16c exist).
 *
 * Dequantizers are compiled without FMA (target avx2,f16c) and with contraction
 * off, so each element rounds exactly like the scalar reference and gguf.quants.
 * Dot products use maddubs/madd integer inner products per 32-element block and
 * an 8-lane float accumulator across blocks. */
#include "quants_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "simd_math.h"

#define DQ __attribute__((target("avx2,f16c"))) /* no fma: cannot contract */
#define AV __attribute__((target("avx2,fma,f16c")))

/* ---------------- helpers ---------------- */

static inline DQ float h2f(const void *p) { return _cvtsh_ss(ei_ld16(p)); }

/* 16 packed bytes -> 32 bytes: low nibbles (elements 0..15) then high nibbles. */
static inline DQ __m256i nibbles32(const uint8_t *p) {
    const __m128i x = _mm_loadu_si128((const __m128i *)p);
    const __m256i v = _mm256_insertf128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* bit i of x -> byte i = 0xff or 0x00. */
static inline DQ __m256i bits32(uint32_t x) {
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000LL, 0x0101010101010101LL,
                                            0x0202020202020202LL, 0x0303030303030303LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* 32 int8 -> four vectors of 8 floats, in element order. */
static inline DQ void i8_to_f32(__m256i v, __m256 f[4]) {
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    f[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    f[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    f[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    f[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

/* dst[0..32) = d * q */
static inline DQ void store_mul(float *dst, __m256i q, float d) {
    __m256 f[4];
    i8_to_f32(q, f);
    const __m256 vd = _mm256_set1_ps(d);
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(vd, f[k]));
}

/* dst[0..32) = d * q + m */
static inline DQ void store_mul_add(float *dst, __m256i q, float d, float m) {
    __m256 f[4];
    i8_to_f32(q, f);
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 8 * k, _mm256_add_ps(_mm256_mul_ps(vd, f[k]), vm));
}

/* dst[0..32) = d * q - m */
static inline DQ void store_mul_sub(float *dst, __m256i q, float d, float m) {
    __m256 f[4];
    i8_to_f32(q, f);
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + 8 * k, _mm256_sub_ps(_mm256_mul_ps(vd, f[k]), vm));
}

/* unsigned x (0..127) times signed y, summed in pairs then quads -> 8 int32 as float */
static inline AV __m256 dot_us8(__m256i ux, __m256i sy) {
    const __m256i p = _mm256_maddubs_epi16(ux, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* signed x times signed y (y != -128) */
static inline AV __m256 dot_ss8(__m256i sx, __m256i sy) {
    return dot_us8(_mm256_sign_epi8(sx, sx), _mm256_sign_epi8(sy, sx));
}

static inline AV __m256i act_q(const ei_q8a *a) { return _mm256_loadu_si256((const __m256i *)a->q); }

/* ---------------- dequantization ---------------- */

DQ void ei_deq_f32_avx2(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

DQ void ei_deq_f16_avx2(const void *src, float *dst, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
    for (; i < n; i++) dst[i] = h2f(s + 2 * i);
}

DQ void ei_deq_bf16_avx2(const void *src, float *dst, int64_t n) {
    const uint8_t *s = (const uint8_t *)src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + 2 * i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) {
        uint32_t b = (uint32_t)ei_ld16(s + 2 * i) << 16;
        memcpy(dst + i, &b, 4);
    }
}

DQ void ei_deq_q4_0_avx2(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK)
        store_mul(dst, _mm256_sub_epi8(nibbles32(b->qs), _mm256_set1_epi8(8)), h2f(&b->d));
}

DQ void ei_deq_q4_1_avx2(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK)
        store_mul_add(dst, nibbles32(b->qs), h2f(&b->d), h2f(&b->m));
}

DQ void ei_deq_q5_0_avx2(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        __m256i q = _mm256_or_si256(nibbles32(b->qs), _mm256_and_si256(bits32(ei_ld32(b->qh)), _mm256_set1_epi8(16)));
        store_mul(dst, _mm256_sub_epi8(q, _mm256_set1_epi8(16)), h2f(&b->d));
    }
}

DQ void ei_deq_q5_1_avx2(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK) {
        __m256i q = _mm256_or_si256(nibbles32(b->qs), _mm256_and_si256(bits32(ei_ld32(b->qh)), _mm256_set1_epi8(16)));
        store_mul_add(dst, q, h2f(&b->d), h2f(&b->m));
    }
}

DQ void ei_deq_q8_0_avx2(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK; i++, b++, dst += QK)
        store_mul(dst, _mm256_loadu_si256((const __m256i *)b->qs), h2f(&b->d));
}

DQ void ei_deq_q4_k_avx2(const void *src, float *dst, int64_t n) {
    const block_q4_K *b = src;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qs = b->qs;
        for (int j = 0; j < 8; j++, dst += 32) {
            uint8_t sc, m;
            ei_k_scale_min(j, scales, &sc, &m);
            __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
            if (j & 1) x = _mm256_srli_epi16(x, 4);
            store_mul_sub(dst, _mm256_and_si256(x, m4), d * (float)sc, dmin * (float)m);
        }
    }
}

DQ void ei_deq_q5_k_avx2(const void *src, float *dst, int64_t n) {
    const block_q5_K *b = src;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qs = b->qs;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
        for (int j = 0; j < 8; j++, dst += 32) {
            uint8_t sc, m;
            ei_k_scale_min(j, scales, &sc, &m);
            __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
            if (j & 1) x = _mm256_srli_epi16(x, 4);
            const __m256i bit = _mm256_set1_epi8((char)(1 << j));
            const __m256i hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(16));
            store_mul_sub(dst, _mm256_or_si256(_mm256_and_si256(x, m4), hb), d * (float)sc, dmin * (float)m);
        }
    }
}

/* Unsigned 6-bit values (0..63) of activation-block j (elements 32j..32j+31) of a Q6_K block. */
static inline DQ __m256i q6k_block(const uint8_t *ql, const uint8_t *qh, int j) {
    const int h = j >> 2, k = j & 3;
    __m256i lo = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32 * (k & 1)));
    lo = _mm256_and_si256(_mm256_srl_epi16(lo, _mm_cvtsi32_si128(4 * (k >> 1))), _mm256_set1_epi8(0x0f));
    __m256i hi = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
    hi = _mm256_and_si256(_mm256_srl_epi16(hi, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}

DQ void ei_deq_q6_k_avx2(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const int8_t *sc = b->scales;
        const float d = h2f(&b->d);
        for (int j = 0; j < 8; j++, dst += 32) {
            __m256i q = _mm256_sub_epi8(q6k_block(b->ql, b->qh, j), _mm256_set1_epi8(32));
            __m256 f[4];
            i8_to_f32(q, f);
            const __m256 d0 = _mm256_set1_ps(d * (float)sc[2 * j]), d1 = _mm256_set1_ps(d * (float)sc[2 * j + 1]);
            _mm256_storeu_ps(dst, _mm256_mul_ps(d0, f[0]));
            _mm256_storeu_ps(dst + 8, _mm256_mul_ps(d0, f[1]));
            _mm256_storeu_ps(dst + 16, _mm256_mul_ps(d1, f[2]));
            _mm256_storeu_ps(dst + 24, _mm256_mul_ps(d1, f[3]));
        }
    }
}

/* ---------------- activation quantization ---------------- */

AV void ei_quantize_act_avx2(const float *x, int64_t n, ei_q8a *out) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            /* max(a, b) returns b when a is NaN: NaNs are skipped, as in the scalar loop */
            mx = _mm256_max_ps(_mm256_and_ps(v[k], absmask), mx);
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], vid)); /* round half even */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, perm);
        p = _mm256_max_epi8(p, _mm256_set1_epi8(-127));
        _mm256_storeu_si256((__m256i *)out[i].q, p);
        /* sum of q: |q| * sign(q) pairs, exact in int */
        __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), p);
        __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
        out[i].d = d;
        out[i].s = d * (float)_mm_cvtsi128_si32(s);
    }
}

/* ---------------- dot products: float weights ---------------- */

AV float ei_dot_f32_avx2(int64_t n, const void *row, const void *act) {
    const float *w = (const float *)row, *x = (const float *)act;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float acc = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) acc += w[i] * x[i];
    return acc;
}

AV float ei_dot_f16_avx2(int64_t n, const void *row, const void *act) {
    const uint8_t *w = (const uint8_t *)row;
    const float *x = (const float *)act;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i))), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i + 16))),
                             _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * i))), _mm256_loadu_ps(x + i), a0);
    float acc = hsum8(_mm256_add_ps(a0, a1));
    for (; i < n; i++) acc += h2f(w + 2 * i) * x[i];
    return acc;
}

AV float ei_dot_bf16_avx2(int64_t n, const void *row, const void *act) {
    const uint8_t *w = (const uint8_t *)row;
    const float *x = (const float *)act;
    __m256 a0 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + 2 * i))), 16);
        a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(v), _mm256_loadu_ps(x + i), a0);
    }
    float acc = hsum8(a0);
    for (; i < n; i++) {
        uint32_t b = (uint32_t)ei_ld16(w + 2 * i) << 16;
        float f;
        memcpy(&f, &b, 4);
        acc += f * x[i];
    }
    return acc;
}

/* ---------------- dot products: quantized weights x ei_q8a ---------------- */

AV float ei_dot_q8_0_avx2(int64_t n, const void *row, const void *act) {
    const block_q8_0 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        const __m256 p = dot_ss8(_mm256_loadu_si256((const __m256i *)b->qs), act_q(a));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(&b->d) * a->d), p, acc);
    }
    return hsum8(acc);
}

AV float ei_dot_q4_0_avx2(int64_t n, const void *row, const void *act) {
    const block_q4_0 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        const __m256i q = _mm256_sub_epi8(nibbles32(b->qs), _mm256_set1_epi8(8));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(&b->d) * a->d), dot_ss8(q, act_q(a)), acc);
    }
    return hsum8(acc);
}

AV float ei_dot_q4_1_avx2(int64_t n, const void *row, const void *act) {
    const block_q4_1 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(&b->d) * a->d), dot_us8(nibbles32(b->qs), act_q(a)), acc);
        summ += h2f(&b->m) * a->s;
    }
    return hsum8(acc) + summ;
}

AV float ei_dot_q5_0_avx2(int64_t n, const void *row, const void *act) {
    const block_q5_0 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        __m256i q = _mm256_or_si256(nibbles32(b->qs), _mm256_and_si256(bits32(ei_ld32(b->qh)), _mm256_set1_epi8(16)));
        q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(&b->d) * a->d), dot_ss8(q, act_q(a)), acc);
    }
    return hsum8(acc);
}

AV float ei_dot_q5_1_avx2(int64_t n, const void *row, const void *act) {
    const block_q5_1 *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QK; i++, b++, a++) {
        __m256i q = _mm256_or_si256(nibbles32(b->qs), _mm256_and_si256(bits32(ei_ld32(b->qh)), _mm256_set1_epi8(16)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(&b->d) * a->d), dot_us8(q, act_q(a)), acc);
        summ += h2f(&b->m) * a->s;
    }
    return hsum8(acc) + summ;
}

AV float ei_dot_q4_k_avx2(int64_t n, const void *row, const void *act) {
    const block_q4_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qs = b->qs;
        for (int p = 0; p < 4; p++, a += 2) {
            uint8_t sc0, m0, sc1, m1;
            ei_k_scale_min(2 * p, scales, &sc0, &m0);
            ei_k_scale_min(2 * p + 1, scales, &sc1, &m1);
            const __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
            const __m256 p0 = dot_us8(_mm256_and_si256(x, m4), act_q(a));
            const __m256 p1 = dot_us8(_mm256_and_si256(_mm256_srli_epi16(x, 4), m4), act_q(a + 1));
            acc = _mm256_fmadd_ps(_mm256_set1_ps((d * (float)sc0) * a[0].d), p0, acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps((d * (float)sc1) * a[1].d), p1, acc);
            summ += (dmin * (float)m0) * a[0].s + (dmin * (float)m1) * a[1].s;
        }
    }
    return hsum8(acc) - summ;
}

AV float ei_dot_q5_k_avx2(int64_t n, const void *row, const void *act) {
    const block_q5_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const __m256i m4 = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(16);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        const uint8_t *scales = b->scales, *qs = b->qs;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
        for (int j = 0; j < 8; j++, a++) {
            uint8_t sc, m;
            ei_k_scale_min(j, scales, &sc, &m);
            __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
            if (j & 1) x = _mm256_srli_epi16(x, 4);
            const __m256i bit = _mm256_set1_epi8((char)(1 << j));
            const __m256i hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), b4);
            const __m256 p = dot_us8(_mm256_or_si256(_mm256_and_si256(x, m4), hb), act_q(a));
            acc = _mm256_fmadd_ps(_mm256_set1_ps((d * (float)sc) * a->d), p, acc);
            summ += (dmin * (float)m) * a->s;
        }
    }
    return hsum8(acc) - summ;
}

AV float ei_dot_q6_k_avx2(int64_t n, const void *row, const void *act) {
    const block_q6_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const __m256i k32 = _mm256_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const int8_t *sc = b->scales;
        const float d = h2f(&b->d);
        for (int j = 0; j < 8; j++, a++) {
            const __m256i q = q6k_block(b->ql, b->qh, j);
            const __m256i y = act_q(a);
            /* (q - 32) * y summed in pairs: exact in int16 (|.| <= 8128) */
            const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(k32, y));
            const __m256i s16 = _mm256_set_m128i(_mm_set1_epi16(sc[2 * j + 1]), _mm_set1_epi16(sc[2 * j]));
            const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, s16));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d), p, acc);
        }
    }
    return hsum8(acc);
}

/* ---------------- the smaller types (kernels.c's SMALL_TYPES) ---------------- */

/* 32 bytes of the two-bit quants of activation block j of a Q2_K / Q3_K super-block */
static inline AV __m256i k2bits(const uint8_t *qs, int j) {
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j >> 2)));
    return _mm256_and_si256(_mm256_srli_epi16(q, 2 * (j & 3)), _mm256_set1_epi8(3));
}

/* 16-bit lanes: a in the low 128 bits (the first 16 elements' pair sums), b in the high */
static inline AV __m256i halves16(int a, int b) {
    return _mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a));
}

AV float ei_dot_q2_k_avx2(int64_t n, const void *row, const void *act) {
    const block_q2_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const __m256i ones = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d), dmin = h2f(&b->dmin);
        for (int j = 0; j < 8; j++, a++) {
            const __m256i y = act_q(a);
            const uint8_t *sc = b->scales + 2 * j;
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(k2bits(b->qs, j), y),
                                                halves16(sc[0] & 15, sc[1] & 15));
            const __m256i m = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, y), halves16(sc[0] >> 4, sc[1] >> 4));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d), _mm256_cvtepi32_ps(p), acc);
            acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * a->d), _mm256_cvtepi32_ps(m), acc);
        }
    }
    return hsum8(acc);
}

AV float ei_dot_q3_k_avx2(int64_t n, const void *row, const void *act) {
    const block_q3_K *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    const __m256i four = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)b->hmask);
        for (int j = 0; j < 8; j++, a++) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * (j >> 2) + (j & 3))));
            const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
            const __m256i q = _mm256_sub_epi8(k2bits(b->qs, j), _mm256_andnot_si256(set, four));   /* -4..3 */
            const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(act_q(a), q));
            const __m256i p = _mm256_madd_epi16(p16, halves16(ei_q3k_scale(b->scales, 2 * j),
                                                              ei_q3k_scale(b->scales, 2 * j + 1)));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d), _mm256_cvtepi32_ps(p), acc);
        }
    }
    return hsum8(acc);
}

/* the table's values of 16 packed index bytes, in element order (nibbles32's) */
static inline AV __m256i iq4_values(const uint8_t *qs) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ei_iq4nl_values));
    return _mm256_shuffle_epi8(table, nibbles32(qs));
}

AV float ei_dot_iq4_nl_avx2(int64_t n, const void *row, const void *act) {
    const block_iq4_nl *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK; i++, b++, a++)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(&b->d) * a->d), dot_ss8(iq4_values(b->qs), act_q(a)), acc);
    return hsum8(acc);
}

AV float ei_dot_iq4_xs_avx2(int64_t n, const void *row, const void *act) {
    const block_iq4_xs *b = row;
    const ei_q8a *a = (const ei_q8a *)act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QKK; i++, b++) {
        const float d = h2f(&b->d);
        for (int s = 0; s < 8; s++, a++) {
            const __m256i v = iq4_values(b->qs + 16 * s);
            const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(act_q(a), v));
            const int sc = ei_iq4xs_scale(b->scales_l, b->scales_h, s);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d),
                                  _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16((short)sc))), acc);
        }
    }
    return hsum8(acc);
}

#endif /* __x86_64__ */
