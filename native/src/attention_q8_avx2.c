/* AVX2 attention over one chunk of a Q8_0 KV arena: the algorithm of chunk_q8_ref
 * (attention.c), for CPUs without AVX-512. The integer products run as float FMAs
 * on the int8 values (a block's score dot stays below 2^24, so it is exact); the
 * blocks' scaled dots and the V sums are rounded like any float sum, so results
 * match the scalar kernel to float precision, not to the bit. tests/test_forward_kernels.py compares it
 * with the scalar kernel and a numpy model. */
#include "attention.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "simd_math.h"

#define AV2 __attribute__((target("avx2,fma,f16c")))

/* 8 int8 as floats. */
static inline AV2 __m256 i8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline AV2 float block_scale(const uint8_t *row, int b) {
    uint16_t h;
    memcpy(&h, row + 34 * b, 2);
    return _cvtsh_ss(h);
}

/* ei_attn_quantize_q's bytes, as floats (qf) for the FMAs below. */
static AV2 void quantize_q(const float *q, int hd, float scale, __m256 *qf, float *dq) {
    const __m256 sc = _mm256_set1_ps(scale), lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < hd / 32; b++) {
        __m256 x[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            x[i] = _mm256_mul_ps(_mm256_loadu_ps(q + 32 * b + 8 * i), sc);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x[i]));
        }
        const float d = hmax8(m) / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 4; i++) {
            const __m256 y = _mm256_round_ps(_mm256_mul_ps(x[i], _mm256_set1_ps(id)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            qf[4 * b + i] = _mm256_max_ps(_mm256_min_ps(y, lim), nlim);
        }
        dq[b] = d;
    }
}

/* The kernel for nb = hd / 32 blocks; a constant nb where inlined unrolls the block loops. */
static inline __attribute__((always_inline)) AV2 void chunk_q8_body(
    const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos, int32_t c0, int32_t c1,
    int32_t pos, const int nb, float scale, float *scores, float *part) {
    const int hd = 32 * nb, pf = EI_ATTN_PART_FLOATS(hd);
    const int32_t n = c1 - c0;
    const size_t rb = (size_t)nb * 34;
    k += (size_t)c0 * rb;
    v += (size_t)c0 * rb;
    cell_pos += c0;
    __m256 qf[EI_ATTN_MAX_GROUP][EI_ATTN_MAX_HD / 8];
    float dq[EI_ATTN_MAX_GROUP][EI_ATTN_MAX_HD / 32], mxs[EI_ATTN_MAX_GROUP];
    float dv[EI_ATTN_MAX_HD / 32][EI_ATTN_CHUNK], w[EI_ATTN_MAX_HD / 32][EI_ATTN_CHUNK];
    for (int j = 0; j < g; j++) {
        quantize_q(q + (size_t)j * hd, hd, scale, qf[j], dq[j]);
        mxs[j] = -INFINITY;
    }
    /* scores: each K block turned into floats once for every head */
    for (int32_t c = 0; c < n; c++) {
        if (!ei_attn_visible(cell_pos[c], pos)) {
            for (int j = 0; j < g; j++) scores[(size_t)j * n + c] = -INFINITY;
            continue;
        }
        const uint8_t *kr = k + (size_t)c * rb;
        __m256 acc[EI_ATTN_MAX_GROUP];   /* each block's dot, times its two scales */
        for (int j = 0; j < g; j++) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *kb = kr + 34 * b + 2;
            const __m256 k0 = i8x8(kb), k1 = i8x8(kb + 8), k2 = i8x8(kb + 16), k3 = i8x8(kb + 24);
            const float dk = block_scale(kr, b);
            for (int j = 0; j < g; j++) {
                const __m256 *qb = qf[j] + 4 * b;
                const __m256 a = _mm256_fmadd_ps(k2, qb[2], _mm256_mul_ps(k0, qb[0]));
                const __m256 a2 = _mm256_fmadd_ps(k3, qb[3], _mm256_mul_ps(k1, qb[1]));
                acc[j] = _mm256_fmadd_ps(_mm256_add_ps(a, a2), _mm256_set1_ps(dq[j][b] * dk), acc[j]);
            }
        }
        for (int j = 0; j < g; j++) {
            const float s = hsum8(acc[j]);
            scores[(size_t)j * n + c] = s;
            if (s > mxs[j]) mxs[j] = s;
        }
    }
    for (int32_t c = 0; c < n; c++)   /* V's block scales, once for every head */
        for (int b = 0; b < nb; b++) dv[b][c] = block_scale(v + (size_t)c * rb, b);
    for (int j = 0; j < g; j++) {
        float *sc = scores + (size_t)j * n, *pj = part + (size_t)j * pf;
        const float mx = mxs[j];
        pj[0] = mx;
        pj[1] = 0.0f;
        if (mx == -INFINITY) {
            memset(pj + 2, 0, sizeof(float) * (size_t)hd);
            continue;
        }
        pj[1] = exp_scores8(sc, n, mx);
        /* 15-bit weights per block (as floats), then one pass over the cells for all blocks */
        float unit[EI_ATTN_MAX_HD / 32];
        for (int b = 0; b < nb; b++) {
            __m256 m8 = _mm256_setzero_ps();
            int32_t c = 0;
            for (; c + 8 <= n; c += 8) m8 = _mm256_max_ps(m8, _mm256_mul_ps(_mm256_loadu_ps(sc + c), _mm256_loadu_ps(dv[b] + c)));
            float wmax = hmax8(m8);
            for (; c < n; c++) wmax = fmaxf(wmax, sc[c] * dv[b][c]);
            const float inv = wmax > EI_ATTN_WMIN ? EI_ATTN_WMAX / wmax : 0.0f;
            const __m256 inv8 = _mm256_set1_ps(inv);
            for (c = 0; c + 8 <= n; c += 8)
                _mm256_storeu_ps(w[b] + c, _mm256_round_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(sc + c), _mm256_loadu_ps(dv[b] + c)), inv8),
                                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            for (; c < n; c++) w[b][c] = nearbyintf(sc[c] * dv[b][c] * inv);
            unit[b] = wmax / EI_ATTN_WMAX;
        }
        __m256 acc[EI_ATTN_MAX_HD / 8];
        for (int i = 0; i < 4 * nb; i++) acc[i] = _mm256_setzero_ps();
        for (int32_t c = 0; c < n; c++) {
            if (sc[c] == 0.0f) continue;
            const uint8_t *vr = v + (size_t)c * rb;
            for (int b = 0; b < nb; b++) {
                const __m256 wb = _mm256_set1_ps(w[b][c]);
                for (int i = 0; i < 4; i++) acc[4 * b + i] = _mm256_fmadd_ps(wb, i8x8(vr + 34 * b + 2 + 8 * i), acc[4 * b + i]);
            }
        }
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(pj + 2 + 32 * b + 8 * i, _mm256_mul_ps(_mm256_set1_ps(unit[b]), acc[4 * b + i]));
    }
}

AV2 void ei_attend_chunk_q8_avx2(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                                 int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part) {
    (void)n_cells;   /* Q8_0 K is rows */
    switch (hd) {   /* the common head sizes with constant block counts */
    case 64: chunk_q8_body(q, g, k, v, cell_pos, c0, c1, pos, 2, scale, scores, part); break;
    case 128: chunk_q8_body(q, g, k, v, cell_pos, c0, c1, pos, 4, scale, scores, part); break;
    case 256: chunk_q8_body(q, g, k, v, cell_pos, c0, c1, pos, 8, scale, scores, part); break;
    default: chunk_q8_body(q, g, k, v, cell_pos, c0, c1, pos, hd / 32, scale, scores, part); break;
    }
}
#endif
