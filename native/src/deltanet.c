/* Qwen3.5's Gated DeltaNet kernels (deltanet.h): the bodies live once in deltanet_impl.h,
 * included here per ISA over that ISA's vector primitives; the scalar ones are the reference.
 * The chunked form's matrix products (gemm) are deltanet_gemm.h's register-tiled loop over the
 * ISA's vector type (VT ... GEMM_NV below); the tile sizes fit each ISA's register file. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "deltanet.h"
#include "kernels.h"
#include "simd_math.h"

static inline float silu1(float g) { return g / (1.0f + expf(-g)); }

/* ---------------- scalar ---------------- */
static inline void axpy_scalar(int64_t n, float a, const float *x, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}
static inline void scale_scalar(int64_t n, float a, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}
static inline float dot_scalar(int64_t n, const float *x, const float *y) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}
static inline void gate_rows_scalar(int64_t n, float r, float *x, const float *w, const float *g) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * r * w[i] * silu1(g[i]);
}
static inline void decay_scalar(int64_t n, float ci, const float *c, float s, float *x) {
    for (int64_t j = 0; j < n; j++) x[j] *= s * expf(ci - c[j]);
}
/* The scalar tile: 4-float groups in GCC's generic vectors (plain per-element arithmetic, the
 * same sums as a scalar loop; lowered to whatever the baseline target has). */
typedef float ei_f4 __attribute__((vector_size(16)));
static inline ei_f4 ld_f4(const float *p) { ei_f4 v; memcpy(&v, p, sizeof v); return v; }
static inline void st_f4(float *p, ei_f4 v) { memcpy(p, &v, sizeof v); }
#define VT ei_f4
#define VW 4
#define VLD(p) ld_f4(p)
#define VST(p, x) st_f4(p, x)
#define VSET1(a) ((ei_f4){(a), (a), (a), (a)})
#define VZERO() ((ei_f4){0.0f, 0.0f, 0.0f, 0.0f})
#define VFMA(a, b, c) ((c) + (a) * (b))
#define GEMM_MR 4
#define GEMM_NV 2
#define SFX scalar
#define TGT
#include "deltanet_gemm.h"
#include "deltanet_impl.h"   /* both undefine what they were given */

#if defined(__x86_64__)
/* ---------------- AVX2 + FMA ---------------- */
#define A2 __attribute__((target("avx2,fma")))
static inline A2 void axpy_avx2(int64_t n, float a, const float *x, float *y) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
static inline A2 void scale_avx2(int64_t n, float a, float *y) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}
static inline A2 float dot_avx2(int64_t n, const float *x, const float *y) {
    __m256 s = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s);
    float r = hsum8(s);
    for (; i < n; i++) r += x[i] * y[i];
    return r;
}
static inline A2 void gate_rows_avx2(int64_t n, float r, float *x, const float *w, const float *g) {
    const __m256 rv = _mm256_set1_ps(r), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_mul_ps(_mm256_loadu_ps(w + i), s)));
    }
    for (; i < n; i++) x[i] = x[i] * r * w[i] * silu1(g[i]);
}
static inline A2 void decay_avx2(int64_t n, float ci, const float *c, float s, float *x) {
    const __m256 civ = _mm256_set1_ps(ci), sv = _mm256_set1_ps(s);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(civ, _mm256_loadu_ps(c + j)));
        _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), _mm256_mul_ps(sv, e)));
    }
    for (; j < n; j++) x[j] *= s * expf(ci - c[j]);
}
#define VT __m256
#define VW 8
#define VLD(p) _mm256_loadu_ps(p)
#define VST(p, x) _mm256_storeu_ps(p, x)
#define VSET1(a) _mm256_set1_ps(a)
#define VZERO() _mm256_setzero_ps()
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define GEMM_MR 6   /* 12 accumulators + 2 rows of B + 1 broadcast of 16 registers */
#define GEMM_NV 2
#define SFX avx2
#define TGT A2
#include "deltanet_gemm.h"
#include "deltanet_impl.h"   /* both undefine what they were given */

/* ---------------- AVX-512 ---------------- */
#define A5 __attribute__((target("avx512f")))
static inline A5 __mmask16 tail16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }
static inline A5 void axpy_avx512(int64_t n, float a, const float *x, float *y) {
    const __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}
static inline A5 void scale_avx512(int64_t n, float a, float *y) {
    const __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m, y + i)));
    }
}
static inline A5 float dot_avx512(int64_t n, const float *x, const float *y) {
    __m512 s = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail16(n - i);
        s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), s);
    }
    return _mm512_reduce_add_ps(s);
}
static inline A5 void gate_rows_avx512(int64_t n, float r, float *x, const float *w, const float *g) {
    const __m512 rv = _mm512_set1_ps(r), one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail16(n - i);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rv),
                                                      _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), s)));
    }
}
static inline A5 void decay_avx512(int64_t n, float ci, const float *c, float s, float *x) {
    const __m512 civ = _mm512_set1_ps(ci), sv = _mm512_set1_ps(s);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = tail16(n - j);
        const __m512 e = exp16(_mm512_sub_ps(civ, _mm512_maskz_loadu_ps(m, c + j)));
        _mm512_mask_storeu_ps(x + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), _mm512_mul_ps(sv, e)));
    }
}
#define VT __m512
#define VW 16
#define VLD(p) _mm512_loadu_ps(p)
#define VST(p, x) _mm512_storeu_ps(p, x)
#define VSET1(a) _mm512_set1_ps(a)
#define VZERO() _mm512_setzero_ps()
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define GEMM_MR 6   /* 24 accumulators + 4 rows of B + 1 broadcast of 32 registers */
#define GEMM_NV 4
#define SFX avx512
#define TGT A5
#include "deltanet_gemm.h"
#include "deltanet_impl.h"   /* both undefine what they were given */
#endif

#if defined(__aarch64__)
/* ---------------- NEON ---------------- */
static inline void axpy_neon(int64_t n, float a, const float *x, float *y) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++) y[i] += a * x[i];
}
static inline void scale_neon(int64_t n, float a, float *y) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_n_f32(vld1q_f32(y + i), a));
    for (; i < n; i++) y[i] *= a;
}
static inline float dot_neon(int64_t n, const float *x, const float *y) {
    float32x4_t s = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) s = vfmaq_f32(s, vld1q_f32(x + i), vld1q_f32(y + i));
    float r = vaddvq_f32(s);
    for (; i < n; i++) r += x[i] * y[i];
    return r;
}
static inline void gate_rows_neon(int64_t n, float r, float *x, const float *w, const float *g) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t gv = vld1q_f32(g + i);
        const float32x4_t s = vdivq_f32(gv, vaddq_f32(one, exp4(vnegq_f32(gv))));
        vst1q_f32(x + i, vmulq_f32(vmulq_n_f32(vld1q_f32(x + i), r), vmulq_f32(vld1q_f32(w + i), s)));
    }
    for (; i < n; i++) x[i] = x[i] * r * w[i] * silu1(g[i]);
}
static inline void decay_neon(int64_t n, float ci, const float *c, float s, float *x) {
    const float32x4_t civ = vdupq_n_f32(ci);
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
        vst1q_f32(x + j, vmulq_f32(vld1q_f32(x + j), vmulq_n_f32(exp4(vsubq_f32(civ, vld1q_f32(c + j))), s)));
    for (; j < n; j++) x[j] *= s * expf(ci - c[j]);
}
#define VT float32x4_t
#define VW 4
#define VLD(p) vld1q_f32(p)
#define VST(p, x) vst1q_f32(p, x)
#define VSET1(a) vdupq_n_f32(a)
#define VZERO() vdupq_n_f32(0.0f)
#define VFMA(a, b, c) vfmaq_f32(c, a, b)
#define GEMM_MR 6   /* 24 accumulators + 4 rows of B + 1 broadcast of 32 registers */
#define GEMM_NV 4
#define SFX neon
#define TGT
#include "deltanet_gemm.h"
#include "deltanet_impl.h"   /* both undefine what they were given */
#endif

/* ---------------- public API ---------------- */

ei_status ei_kernel_delta_rule(int isa, int chunk, const float *q, const float *k, const float *v, const float *g,
                               const float *beta, int64_t n_tok, int n_heads, int n_k_heads, int dk, int dv,
                               float *state, float *o) {
    if (!q || !k || !v || !g || !beta || !state || !o || n_tok < 0 || chunk < 0 || n_k_heads < 1 ||
        n_heads < n_k_heads || n_heads % n_k_heads || dk < 1 || dv < 1)
        return ei_fail(EI_ERR_INVALID_ARG, "kernel_delta_rule: bad arguments");
    const ei_kernels *kt = ei_kernels_get(isa);
    if (!kt) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    float *scratch = malloc((size_t)ei_delta_scratch_floats(chunk, dk, dv) * sizeof(float));
    if (!scratch) return ei_fail(EI_ERR_OUT_OF_MEMORY, "kernel_delta_rule: out of memory");
    for (int h = 0; h < n_heads; h++) {
        const int kh = h % n_k_heads;   /* tiled value heads */
        const ei_delta_head a = {.q = q + kh * dk, .k = k + kh * dk, .v = v + h * dv, .g = g + h, .beta = beta + h,
                                 .o = o + h * dv, .state = state + (int64_t)h * dk * dv,
                                 .ld_qk = (int64_t)n_k_heads * dk, .ld_v = (int64_t)n_heads * dv, .ld_gb = n_heads,
                                 .ld_o = (int64_t)n_heads * dv, .n_tok = n_tok, .dk = dk, .dv = dv};
        (chunk ? kt->delta_chunked : kt->delta_step)(&a, chunk, scratch);
    }
    free(scratch);
    return EI_OK;
}

ei_status ei_kernel_l2norm(int isa, float *x, int64_t n_rows, int64_t d, float eps, float scale) {
    if (!x || n_rows < 0 || d < 1) return ei_fail(EI_ERR_INVALID_ARG, "kernel_l2norm: bad arguments");
    const ei_kernels *kt = ei_kernels_get(isa);
    if (!kt) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    kt->l2norm(x, n_rows, d, eps, scale);
    return EI_OK;
}

ei_status ei_kernel_gated_rms_norm(int isa, float *x, const float *w, const float *gate, int64_t n_rows, int64_t d,
                                   float eps) {
    if (!x || !w || !gate || n_rows < 0 || d < 1) return ei_fail(EI_ERR_INVALID_ARG, "kernel_gated_rms_norm: bad arguments");
    const ei_kernels *kt = ei_kernels_get(isa);
    if (!kt) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    kt->gated_norm(x, w, gate, n_rows, d, eps);
    return EI_OK;
}
