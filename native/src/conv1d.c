/* Causal depthwise conv1d with state (the recurrent layers' short convolution): each channel
 * sees its last K inputs, the K - 1 before a run from the slot's window. Taps are tap-major
 * ([K][ch]) so every path runs across channels; the scalar loop is the reference. */
#include <string.h>

#include "common.h"
#include "kernels.h"
#include "simd_math.h"

/* Input s of a run: x[s] for s >= 0, else window row K - 1 + s. */
static inline const float *conv_in(const float *state, const float *x, int K, int64_t ch, int64_t s) {
    return s >= 0 ? x + s * ch : state + (K - 1 + s) * ch;
}

/* The window becomes the run's last K - 1 inputs; rows are read at or after the row written. */
static void conv_shift(float *state, const float *x, int K, int64_t ch, int64_t n_tok) {
    for (int j = 0; j < K - 1; j++)
        memmove(state + j * ch, conv_in(state, x, K, ch, n_tok - (K - 1) + j), (size_t)ch * sizeof(float));
}

void ei_conv1d_scalar(const float *w, int K, int64_t ch, float *state, const float *x, int64_t n_tok, float *y) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t c = 0; c < ch; c++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += w[k * ch + c] * conv_in(state, x, K, ch, t - (K - 1) + k)[c];
            y[t * ch + c] = acc;
        }
    conv_shift(state, x, K, ch, n_tok);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void ei_conv1d_avx2(const float *w, int K, int64_t ch, float *state,
                                                         const float *x, int64_t n_tok, float *y) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float *in[16];
        for (int k = 0; k < K; k++) in[k] = conv_in(state, x, K, ch, t - (K - 1) + k);
        int64_t c = 0;
        for (; c + 8 <= ch; c += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int k = 0; k < K; k++) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + k * ch + c), _mm256_loadu_ps(in[k] + c), acc);
            _mm256_storeu_ps(y + t * ch + c, acc);
        }
        for (; c < ch; c++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += w[k * ch + c] * in[k][c];
            y[t * ch + c] = acc;
        }
    }
    conv_shift(state, x, K, ch, n_tok);
}

__attribute__((target("avx512f"))) void ei_conv1d_avx512(const float *w, int K, int64_t ch, float *state,
                                                          const float *x, int64_t n_tok, float *y) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float *in[16];
        for (int k = 0; k < K; k++) in[k] = conv_in(state, x, K, ch, t - (K - 1) + k);
        int64_t c = 0;
        for (; c < ch; c += 16) {
            const __mmask16 m = ch - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ch - c)) - 1);
            __m512 acc = _mm512_setzero_ps();
            for (int k = 0; k < K; k++)
                acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + k * ch + c), _mm512_maskz_loadu_ps(m, in[k] + c), acc);
            _mm512_mask_storeu_ps(y + t * ch + c, m, acc);
        }
    }
    conv_shift(state, x, K, ch, n_tok);
}
#endif

#if defined(__aarch64__)
void ei_conv1d_neon(const float *w, int K, int64_t ch, float *state, const float *x, int64_t n_tok, float *y) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float *in[16];
        for (int k = 0; k < K; k++) in[k] = conv_in(state, x, K, ch, t - (K - 1) + k);
        int64_t c = 0;
        for (; c + 4 <= ch; c += 4) {
            float32x4_t acc = vdupq_n_f32(0.0f);
            for (int k = 0; k < K; k++) acc = vfmaq_f32(acc, vld1q_f32(w + k * ch + c), vld1q_f32(in[k] + c));
            vst1q_f32(y + t * ch + c, acc);
        }
        for (; c < ch; c++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += w[k * ch + c] * in[k][c];
            y[t * ch + c] = acc;
        }
    }
    conv_shift(state, x, K, ch, n_tok);
}
#endif

ei_status ei_kernel_conv1d(int isa, const float *w, int K, int64_t ch, float *state, const float *x, int64_t n_tok,
                           float *y) {
    if (!w || !state || !x || !y || K < 2 || K > EI_CONV_MAX_K || ch < 1 || n_tok < 0)
        return ei_fail(EI_ERR_INVALID_ARG, "kernel_conv1d: bad arguments");
    const ei_kernels *k = ei_kernels_get(isa);
    if (!k) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    k->conv1d(w, K, ch, state, x, n_tok, y);
    return EI_OK;
}
