/* LoRA's up projection as rank-many axpys: y[i] += sum_k c[k] * bt[k * ld + i], i < n (bt: B transposed,
 * one row of the output width per rank; the k order is fixed, so a row's result never depends on the batch). */
#include "common.h"
#include "kernels.h"

void ei_lora_up_scalar(int64_t n, int rank, const float *c, const float *bt, int64_t ld, float *y) {
    for (int64_t i = 0; i < n; i++) {
        float acc = y[i];
        for (int k = 0; k < rank; k++) acc += c[k] * bt[k * ld + i];
        y[i] = acc;
    }
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2,fma"))) void ei_lora_up_avx2(int64_t n, int rank, const float *c, const float *bt,
                                                          int64_t ld, float *y) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a0 = _mm256_loadu_ps(y + i), a1 = _mm256_loadu_ps(y + i + 8);
        for (int k = 0; k < rank; k++) {
            const __m256 ck = _mm256_set1_ps(c[k]);
            a0 = _mm256_fmadd_ps(ck, _mm256_loadu_ps(bt + k * ld + i), a0);
            a1 = _mm256_fmadd_ps(ck, _mm256_loadu_ps(bt + k * ld + i + 8), a1);
        }
        _mm256_storeu_ps(y + i, a0);
        _mm256_storeu_ps(y + i + 8, a1);
    }
    for (; i < n; i++) {   /* the tail with the same fused steps as the vector lanes */
        float acc = y[i];
        for (int k = 0; k < rank; k++) acc = __builtin_fmaf(c[k], bt[k * ld + i], acc);
        y[i] = acc;
    }
}
#endif

#if defined(__aarch64__)
#include <arm_neon.h>
void ei_lora_up_neon(int64_t n, int rank, const float *c, const float *bt, int64_t ld, float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t a0 = vld1q_f32(y + i), a1 = vld1q_f32(y + i + 4);
        for (int k = 0; k < rank; k++) {
            a0 = vfmaq_n_f32(a0, vld1q_f32(bt + k * ld + i), c[k]);
            a1 = vfmaq_n_f32(a1, vld1q_f32(bt + k * ld + i + 4), c[k]);
        }
        vst1q_f32(y + i, a0);
        vst1q_f32(y + i + 4, a1);
    }
    for (; i < n; i++) {
        float acc = y[i];
        for (int k = 0; k < rank; k++) acc = __builtin_fmaf(c[k], bt[k * ld + i], acc);
        y[i] = acc;
    }
}
#endif

ei_status ei_kernel_lora_up(int isa, int64_t n, int rank, const float *c, const float *bt, int64_t ld, float *y) {
    if (!c || !bt || !y || n < 0 || rank < 1 || ld < n) return ei_fail(EI_ERR_INVALID_ARG, "kernel_lora_up: bad arguments");
    const ei_kernels *k = ei_kernels_get(isa);
    if (!k) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    k->lora_up(n, rank, c, bt, ld, y);
    return EI_OK;
}
