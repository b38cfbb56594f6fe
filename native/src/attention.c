#include "attention.h"

#include <math.h>
#include <stdlib.h>

#include "edgeinfer.h"
#include "common.h"
#include "kernels.h"
#include "simd_math.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static inline int visible(int32_t cp, int32_t pos) { return cp >= 0 && cp <= pos; }

static void empty_part(float *part, int hd) {
    part[0] = -INFINITY;
    part[1] = 0.0f;
    for (int i = 0; i < hd; i++) part[2 + i] = 0.0f;
}

/* ---- scalar reference ---- */
static void chunk_ref(const float *q, int g, const uint16_t *k, const uint16_t *v, const int32_t *cell_pos,
                      int32_t c0, int32_t c1, int32_t pos, int hd, float scale, float *scores, float *part) {
    const int32_t n = c1 - c0;
    for (int j = 0; j < g; j++) {
        const float *qj = q + (size_t)j * hd;
        float *sc = scores + (size_t)j * n, *pj = part + (size_t)j * EI_ATTN_PART_FLOATS(hd);
        float mx = -INFINITY;
        for (int32_t c = 0; c < n; c++) {
            if (!visible(cell_pos[c0 + c], pos)) {
                sc[c] = -INFINITY;
                continue;
            }
            const uint16_t *kc = k + (size_t)(c0 + c) * hd;
            float s = 0.0f;
            for (int i = 0; i < hd; i++) s += ei_fp16_to_fp32(kc[i]) * qj[i];
            sc[c] = s * scale;
            if (sc[c] > mx) mx = sc[c];
        }
        empty_part(pj, hd);
        if (mx == -INFINITY) continue;
        float sum = 0.0f;
        for (int32_t c = 0; c < n; c++) {
            if (sc[c] == -INFINITY) continue;
            const float p = expf(sc[c] - mx);
            sum += p;
            const uint16_t *vc = v + (size_t)(c0 + c) * hd;
            for (int i = 0; i < hd; i++) pj[2 + i] += p * ei_fp16_to_fp32(vc[i]);
        }
        pj[0] = mx;
        pj[1] = sum;
    }
}

#if defined(__x86_64__)
#define AV __attribute__((target("avx2,fma,f16c")))

static inline AV float hsum8(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline AV __m256 ld_h8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* hd a multiple of 8, at most 256: per head, scores of the chunk, one vector
 * exp pass, then V accumulated in registers (hd / 8 accumulators). Inlined
 * with a constant hd for the common head sizes so the arrays live in registers. */
static inline __attribute__((always_inline)) AV void chunk_avx2_body(
    const float *q, int g, const uint16_t *k, const uint16_t *v, const int32_t *cell_pos, int32_t c0, int32_t c1,
    int32_t pos, const int hd, float scale, float *scores, float *part) {
    const int32_t n = c1 - c0;
    const int nv = hd / 8;
    for (int j = 0; j < g; j++) {
        const float *qj = q + (size_t)j * hd;
        float *sc = scores + (size_t)j * n, *pj = part + (size_t)j * EI_ATTN_PART_FLOATS(hd);
        __m256 qv[32];
        for (int i = 0; i < nv; i++) qv[i] = _mm256_mul_ps(_mm256_loadu_ps(qj + 8 * i), _mm256_set1_ps(scale));
        float mx = -INFINITY;
        for (int32_t c = 0; c < n; c++) {
            if (!visible(cell_pos[c0 + c], pos)) {
                sc[c] = -INFINITY;
                continue;
            }
            const uint16_t *kc = k + (size_t)(c0 + c) * hd;
            __m256 a0 = _mm256_mul_ps(ld_h8(kc), qv[0]), a1 = _mm256_setzero_ps();
            for (int i = 1; i + 1 < nv; i += 2) {
                a1 = _mm256_fmadd_ps(ld_h8(kc + 8 * i), qv[i], a1);
                a0 = _mm256_fmadd_ps(ld_h8(kc + 8 * i + 8), qv[i + 1], a0);
            }
            if (nv % 2 == 0) a1 = _mm256_fmadd_ps(ld_h8(kc + 8 * (nv - 1)), qv[nv - 1], a1);
            sc[c] = hsum8(_mm256_add_ps(a0, a1));
            if (sc[c] > mx) mx = sc[c];
        }
        empty_part(pj, hd);
        if (mx == -INFINITY) continue;
        const __m256 mxv = _mm256_set1_ps(mx);
        __m256 sumv = _mm256_setzero_ps();
        int32_t c = 0;
        const __m256 ninf = _mm256_set1_ps(-INFINITY);
        for (; c + 8 <= n; c += 8) {   /* masked cells hold -inf and get weight 0 */
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
        __m256 acc[32];
        for (int i = 0; i < nv; i++) acc[i] = _mm256_setzero_ps();
        for (c = 0; c < n; c++) {
            if (sc[c] == 0.0f) continue;
            const __m256 p = _mm256_set1_ps(sc[c]);
            const uint16_t *vc = v + (size_t)(c0 + c) * hd;
            for (int i = 0; i < nv; i++) acc[i] = _mm256_fmadd_ps(p, ld_h8(vc + 8 * i), acc[i]);
        }
        for (int i = 0; i < nv; i++) _mm256_storeu_ps(pj + 2 + 8 * i, acc[i]);
        pj[0] = mx;
        pj[1] = sum;
    }
}

static AV void chunk_avx2(const float *q, int g, const uint16_t *k, const uint16_t *v, const int32_t *cell_pos,
                          int32_t c0, int32_t c1, int32_t pos, int hd, float scale, float *scores, float *part) {
    switch (hd) {
    case 64: chunk_avx2_body(q, g, k, v, cell_pos, c0, c1, pos, 64, scale, scores, part); break;
    case 128: chunk_avx2_body(q, g, k, v, cell_pos, c0, c1, pos, 128, scale, scores, part); break;
    default: chunk_avx2_body(q, g, k, v, cell_pos, c0, c1, pos, hd, scale, scores, part); break;
    }
}
#endif

void ei_attend_chunk(int isa, const float *q, int g, const uint16_t *k, const uint16_t *v,
                     const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t pos, int hd, float scale,
                     float *scores, float *part) {
#if defined(__x86_64__)
    if ((isa == EI_ISA_AVX2 || isa == EI_ISA_AVX512) && hd % 8 == 0 && hd <= 256) {
        chunk_avx2(q, g, k, v, cell_pos, c0, c1, pos, hd, scale, scores, part);
        return;
    }
#else
    (void)isa;
#endif
    chunk_ref(q, g, k, v, cell_pos, c0, c1, pos, hd, scale, scores, part);
}

void ei_attend_merge(const float *parts, int n_chunks, int64_t part_stride, int hd, float *out) {
    float m = -INFINITY, s = 0.0f;
    for (int i = 0; i < hd; i++) out[i] = 0.0f;
    for (int c = 0; c < n_chunks; c++) {
        const float *p = parts + c * part_stride;
        if (p[0] == -INFINITY) continue;
        const float mn = p[0] > m ? p[0] : m;
        const float a = m == -INFINITY ? 0.0f : expf(m - mn), b = expf(p[0] - mn);
        for (int i = 0; i < hd; i++) out[i] = out[i] * a + p[2 + i] * b;
        s = s * a + p[1] * b;
        m = mn;
    }
    if (s > 0.0f) {
        const float inv = 1.0f / s;
        for (int i = 0; i < hd; i++) out[i] *= inv;
    }
}

ei_status ei_kernel_attention(int isa, const float *q, int g, const uint16_t *k, const uint16_t *v,
                              const int32_t *cell_pos, int32_t n_cells, int32_t pos, int hd, float *out) {
    if (!q || !k || !v || !cell_pos || !out || g < 1 || n_cells < 1 || hd < 1 || hd > 1024)
        return ei_fail(EI_ERR_INVALID_ARG, "kernel_attention: bad arguments");
    if (isa == EI_ISA_BEST) isa = ei_cpu_best_isa();
    if (!ei_isa_supported(isa)) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    const int n_chunks = (n_cells + EI_ATTN_CHUNK - 1) / EI_ATTN_CHUNK, pf = EI_ATTN_PART_FLOATS(hd);
    float *scores = malloc(sizeof(float) * (size_t)g * EI_ATTN_CHUNK);
    float *parts = malloc(sizeof(float) * (size_t)n_chunks * g * pf);
    if (!scores || !parts) {
        free(scores);
        free(parts);
        return ei_fail(EI_ERR_OUT_OF_MEMORY, "kernel_attention: out of memory");
    }
    const float scale = 1.0f / sqrtf((float)hd);
    for (int c = 0; c < n_chunks; c++) {
        const int32_t c0 = c * EI_ATTN_CHUNK, c1 = c0 + EI_ATTN_CHUNK < n_cells ? c0 + EI_ATTN_CHUNK : n_cells;
        ei_attend_chunk(isa, q, g, k, v, cell_pos, c0, c1, pos, hd, scale, scores, parts + (size_t)c * g * pf);
    }
    for (int j = 0; j < g; j++) ei_attend_merge(parts + (size_t)j * pf, n_chunks, (int64_t)g * pf, hd, out + (size_t)j * hd);
    free(scores);
    free(parts);
    return EI_OK;
}
