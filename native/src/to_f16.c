/* Float rows to IEEE half, rounding to nearest even (the F16 KV cache). The scalar
 * loop (ei_fp32_to_fp16) is the reference; F16C and NEON's fcvtn give the same bits,
 * NaN payloads included. */
#include "common.h"
#include "kernels.h"

void ei_to_f16_scalar(const float *x, int64_t n, uint16_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = ei_fp32_to_fp16(x[i]);
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2,f16c"))) void ei_to_f16_f16c(const float *x, int64_t n, uint16_t *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    ei_to_f16_scalar(x + i, n - i, out + i);
}
#endif

#if defined(__aarch64__)
#include <arm_neon.h>

void ei_to_f16_neon(const float *x, int64_t n, uint16_t *out) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    ei_to_f16_scalar(x + i, n - i, out + i);
}
#endif

void ei_kernel_to_f16(const ei_kernels *k, const float *x, int64_t n, uint16_t *out) { k->to_f16(x, n, out); }
