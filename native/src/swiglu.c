/* SwiGLU activation kernels: gate = silu(gate) * up. */
#include <math.h>

#include "common.h"
#include "kernels.h"
#include "simd_math.h"

void ei_swiglu_scalar(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void ei_swiglu_avx2(float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    ei_swiglu_scalar(gate + i, up + i, n - i);
}
#endif

ei_status ei_kernel_swiglu(int isa, float *gate, const float *up, int64_t n) {
    if (!gate || !up || n < 0) return ei_fail(EI_ERR_INVALID_ARG, "kernel_swiglu: bad arguments");
    const ei_kernels *k = ei_kernels_get(isa);
    if (!k) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    k->swiglu(gate, up, n);
    return EI_OK;
}
