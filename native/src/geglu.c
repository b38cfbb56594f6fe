/* GeGLU activation kernels (Gemma): gate = gelu_tanh(gate) * up, with
 * gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The SIMD paths write
 * 0.5 (1 + tanh(u)) as 1 / (1 + exp(-2u)) with the shared exp polynomial. */
#include <math.h>

#include "common.h"
#include "kernels.h"
#include "simd_math.h"

#define GELU_C 0.7978845608028654f   /* sqrt(2 / pi) */
#define GELU_A 0.044715f

void ei_geglu_scalar(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i];
        gate[i] = 0.5f * x * (1.0f + tanhf(GELU_C * (x + GELU_A * x * x * x))) * up[i];
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void ei_geglu_avx2(float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), m2c = _mm256_set1_ps(-2.0f * GELU_C), a = _mm256_set1_ps(GELU_A);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(gate + i);
        const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(a, x), _mm256_mul_ps(x, x), x);
        const __m256 e = exp8(_mm256_mul_ps(m2c, inner));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    ei_geglu_scalar(gate + i, up + i, n - i);
}

__attribute__((target("avx512f"))) void ei_geglu_avx512(float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    const __m512 one = _mm512_set1_ps(1.0f), m2c = _mm512_set1_ps(-2.0f * GELU_C), a = _mm512_set1_ps(GELU_A);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(gate + i);
        const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(a, x), _mm512_mul_ps(x, x), x);
        const __m512 e = exp16(_mm512_mul_ps(m2c, inner));
        _mm512_storeu_ps(gate + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
    }
    ei_geglu_scalar(gate + i, up + i, n - i);
}
#endif

#if defined(__aarch64__)
void ei_geglu_neon(float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    const float32x4_t one = vdupq_n_f32(1.0f), m2c = vdupq_n_f32(-2.0f * GELU_C), a = vdupq_n_f32(GELU_A);
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(gate + i);
        const float32x4_t inner = vfmaq_f32(x, vmulq_f32(a, x), vmulq_f32(x, x));
        const float32x4_t e = exp4(vmulq_f32(m2c, inner));
        vst1q_f32(gate + i, vmulq_f32(vdivq_f32(x, vaddq_f32(one, e)), vld1q_f32(up + i)));
    }
    ei_geglu_scalar(gate + i, up + i, n - i);
}
#endif

ei_status ei_kernel_geglu(int isa, float *gate, const float *up, int64_t n) {
    if (!gate || !up || n < 0) return ei_fail(EI_ERR_INVALID_ARG, "kernel_geglu: bad arguments");
    const ei_kernels *k = ei_kernels_get(isa);
    if (!k) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    k->geglu(gate, up, n);
    return EI_OK;
}
