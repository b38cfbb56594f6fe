/* Small vector math shared by the SIMD kernels (x86: AVX2 + FMA, AVX-512; aarch64: NEON). */
#ifndef EI_SIMD_MATH_H
#define EI_SIMD_MATH_H
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* exp(x) for x <= 88 (Cephes' polynomial, ~1 ulp); x below -87.3 gives ~1e-38, not 0. */
static inline __attribute__((target("avx2,fma"))) __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));   /* NaN stays NaN */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* The sum of 8 lanes. */
static inline __attribute__((target("avx2"))) float hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* The largest of 8 lanes. */
static inline __attribute__((target("avx2"))) float hmax8(__m256 x) {
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)));
}

/* Attention scores sc[0..n) -> exp(score - mx), 0 where the score is -inf (not visible);
 * returns their sum. 8 lanes at a time, the tail with expf. */
static inline __attribute__((target("avx2,fma"))) float exp_scores8(float *sc, int32_t n, float mx) {
    const __m256 mxv = _mm256_set1_ps(mx), ninf = _mm256_set1_ps(-INFINITY);
    __m256 sumv = _mm256_setzero_ps();
    int32_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 x = _mm256_loadu_ps(sc + c);
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(x, mxv)), _mm256_cmp_ps(x, ninf, _CMP_NEQ_OQ));
        _mm256_storeu_ps(sc + c, e);
        sumv = _mm256_add_ps(sumv, e);
    }
    float sum = hsum8(sumv);
    for (; c < n; c++) {
        sc[c] = sc[c] == -INFINITY ? 0.0f : expf(sc[c] - mx);
        sum += sc[c];
    }
    return sum;
}

/* exp8's polynomial on 16 lanes, for the AVX-512 kernels. */
static inline __attribute__((target("avx512f"))) __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));   /* NaN stays NaN */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);   /* p * 2^n in one step, the same bits as building 2^n (n in [-126, 127]) */
}

/* The first n (at most 16) lanes. */
static inline __attribute__((target("avx512f"))) __mmask16 lanes_below(int32_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* Attention scores sc[0..n) -> exp(score - mx), 0 where the score is -inf (not visible);
 * returns their sum. */
static inline __attribute__((target("avx512f"))) float exp_scores16(float *sc, int32_t n, float mx) {
    const __m512 mxv = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    for (int32_t c = 0; c < n; c += 16) {
        const __mmask16 valid = lanes_below(n - c);
        const __m512 x = _mm512_maskz_loadu_ps(valid, sc + c);
        const __mmask16 live = _mm512_mask_cmp_ps_mask(valid, x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        const __m512 e = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(x, mxv)));
        _mm512_mask_storeu_ps(sc + c, valid, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

#elif defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <stdint.h>

/* exp8's polynomial on 4 lanes (NEON). */
static inline float32x4_t exp4(float32x4_t x) {
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.3f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* Attention scores sc[0..n) -> exp(score - mx), 0 where the score is -inf (not visible);
 * returns their sum. 4 lanes at a time, the tail with expf. */
static inline float exp_scores4(float *sc, int32_t n, float mx) {
    const float32x4_t mxv = vdupq_n_f32(mx), ninf = vdupq_n_f32(-INFINITY);
    float32x4_t sum = vdupq_n_f32(0.0f);
    int32_t c = 0;
    for (; c + 4 <= n; c += 4) {
        const float32x4_t x = vld1q_f32(sc + c);
        const uint32x4_t live = vmvnq_u32(vceqq_f32(x, ninf));
        const float32x4_t e = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(exp4(vsubq_f32(x, mxv))), live));
        vst1q_f32(sc + c, e);
        sum = vaddq_f32(sum, e);
    }
    float s = vaddvq_f32(sum);
    for (; c < n; c++) {
        sc[c] = sc[c] == -INFINITY ? 0.0f : expf(sc[c] - mx);
        s += sc[c];
    }
    return s;
}
#endif
#endif
