#include "attention.h"

#include <math.h>

#include "edgeinfer.h"
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- scalar reference ---- */
static float dot_f16_ref(const uint16_t *k, const float *q, int hd) {
    float s = 0.0f;
    for (int i = 0; i < hd; i++) s += ei_fp16_to_fp32(k[i]) * q[i];
    return s;
}

static void axpy_f16_ref(float *out, const uint16_t *v, float w, int hd) {
    for (int i = 0; i < hd; i++) out[i] += w * ei_fp16_to_fp32(v[i]);
}

#if defined(__x86_64__)
/* ---- AVX2 + F16C (hd a multiple of 8, else the reference is used) ---- */
__attribute__((target("avx2,fma,f16c"))) static float dot_f16_avx2(const uint16_t *k, const float *q, int hd) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < hd; i += 8) {
        __m256 kf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i)));
        acc = _mm256_fmadd_ps(kf, _mm256_loadu_ps(q + i), acc);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma,f16c"))) static void axpy_f16_avx2(float *out, const uint16_t *v, float w, int hd) {
    __m256 wv = _mm256_set1_ps(w);
    for (int i = 0; i < hd; i += 8) {
        __m256 vf = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(wv, vf, _mm256_loadu_ps(out + i)));
    }
}
#endif

void ei_attend_head(int isa, const float *q, const uint16_t *k, const uint16_t *v, const int32_t *cell_pos,
                    int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *out) {
    float (*dot)(const uint16_t *, const float *, int) = dot_f16_ref;
    void (*axpy)(float *, const uint16_t *, float, int) = axpy_f16_ref;
#if defined(__x86_64__)
    if (isa >= EI_ISA_AVX2 && isa != EI_ISA_NEON && hd % 8 == 0) {
        dot = dot_f16_avx2;
        axpy = axpy_f16_avx2;
    }
#else
    (void)isa;
#endif
    float mx = -INFINITY;
    for (int32_t c = 0; c < n_cells; c++) {
        int32_t cp = cell_pos[c];
        if (cp < 0 || cp > pos) {
            scores[c] = -INFINITY;
            continue;
        }
        float s = dot(k + (size_t)c * hd, q, hd) * scale;
        scores[c] = s;
        if (s > mx) mx = s;
    }
    for (int i = 0; i < hd; i++) out[i] = 0.0f;
    if (mx == -INFINITY) return;   /* nothing visible: cannot happen for a token that wrote its own cell */
    double sum = 0.0;
    for (int32_t c = 0; c < n_cells; c++) {
        if (scores[c] == -INFINITY) continue;
        float e = expf(scores[c] - mx);
        scores[c] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int32_t c = 0; c < n_cells; c++) {
        if (scores[c] == -INFINITY) continue;
        axpy(out, v + (size_t)c * hd, scores[c] * inv, hd);
    }
}
