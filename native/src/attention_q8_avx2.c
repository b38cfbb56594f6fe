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

/* The lane sums of 4 vectors as one: lane j of the result is the sum of a[j]'s 8 lanes. */
static inline __attribute__((always_inline)) AV2 __m128 hsum4x8(const __m256 *a) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* V for JV heads and values [8 * s0, 8 * (s0 + 2)) (one block's half: a pair of 8-value
 * slices): o[j] += sum over the cells of the 15-bit weight w[j][b][c] times the cell's int8 V,
 * each V slice turned into floats once for the JV heads. A cell whose JV softmax weights are
 * all 0 is skipped; a zero weight beside others adds 0, so a head's sum is the same in any
 * grouping. */
static inline __attribute__((always_inline)) AV2 void heads_v_q8(const int JV, int s0, int32_t n, const uint8_t *v,
                                                                 size_t rb, const float *sc, const float *w,
                                                                 size_t w_head, __m256 *out) {
    const int b = s0 / 4;
    __m256 a[4][2];
    for (int j = 0; j < JV; j++) a[j][0] = a[j][1] = _mm256_setzero_ps();
    const uint8_t *vb = v + 34 * b + 2 + 8 * (s0 % 4);
    for (int32_t c = 0; c < n; c++) {
        int any = 0;
        for (int j = 0; j < JV; j++) any |= sc[(size_t)j * n + c] != 0.0f;
        if (!any) continue;
        const __m256 x0 = i8x8(vb + (size_t)c * rb), x1 = i8x8(vb + (size_t)c * rb + 8);
        for (int j = 0; j < JV; j++) {
            const __m256 wj = _mm256_set1_ps(w[(size_t)j * w_head + (size_t)b * EI_ATTN_CHUNK + c]);
            a[j][0] = _mm256_fmadd_ps(wj, x0, a[j][0]);
            a[j][1] = _mm256_fmadd_ps(wj, x1, a[j][1]);
        }
    }
    for (int j = 0; j < JV; j++) {
        out[2 * j] = a[j][0];
        out[2 * j + 1] = a[j][1];
    }
}

/* Scores of JN heads (quantized queries qf, their block scales dq) over the chunk's n cells into
 * sc[j * n + c] (-inf where not visible), the heads' maxima into mx[0..3] (lanes past JN unused). */
static inline __attribute__((always_inline)) AV2 void q8_scores(const int JN, const __m256 (*qf)[EI_ATTN_MAX_HD / 8],
                                                                const float (*dq)[EI_ATTN_MAX_HD / 32], const uint8_t *k,
                                                                size_t rb, const int nb, const int32_t *cell_pos,
                                                                int32_t n, int32_t pos, float *sc, float *mx) {
    __m128 mx4 = _mm_set1_ps(-INFINITY);
    for (int32_t c = 0; c < n; c++) {
        if (!ei_attn_visible(cell_pos[c], pos)) {
            for (int j = 0; j < JN; j++) sc[(size_t)j * n + c] = -INFINITY;
            continue;
        }
        const uint8_t *kr = k + (size_t)c * rb;
        __m256 acc[4];   /* each block's dot, times its two scales */
        for (int j = 0; j < 4; j++) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *kb = kr + 34 * b + 2;
            const __m256 k0 = i8x8(kb), k1 = i8x8(kb + 8), k2 = i8x8(kb + 16), k3 = i8x8(kb + 24);
            const float dk = block_scale(kr, b);
            for (int j = 0; j < JN; j++) {
                const __m256 *qb = qf[j] + 4 * b;
                const __m256 a = _mm256_fmadd_ps(k2, qb[2], _mm256_mul_ps(k0, qb[0]));
                const __m256 a2 = _mm256_fmadd_ps(k3, qb[3], _mm256_mul_ps(k1, qb[1]));
                acc[j] = _mm256_fmadd_ps(_mm256_add_ps(a, a2), _mm256_set1_ps(dq[j][b] * dk), acc[j]);
            }
        }
        const __m128 s4 = hsum4x8(acc);
        mx4 = _mm_max_ps(mx4, s4);
        for (int j = 0; j < JN; j++) {
            float s;
            _MM_EXTRACT_FLOAT(s, s4, j);
            sc[(size_t)j * n + c] = s;
        }
    }
    _mm_storeu_ps(mx, mx4);
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
    float dq[EI_ATTN_MAX_GROUP][EI_ATTN_MAX_HD / 32];
    float dv[EI_ATTN_MAX_HD / 32][EI_ATTN_CHUNK], w[EI_ATTN_MAX_GROUP][EI_ATTN_MAX_HD / 32][EI_ATTN_CHUNK];
    const size_t w_head = (size_t)(EI_ATTN_MAX_HD / 32) * EI_ATTN_CHUNK;
    float mxs[EI_ATTN_MAX_GROUP + 3];   /* q8_scores writes 4 lanes */
    for (int j = 0; j < g; j++) quantize_q(q + (size_t)j * hd, hd, scale, qf[j], dq[j]);
    /* scores: each K block turned into floats once for every head; 4 heads' sums at once */
    for (int j0 = 0; j0 < g; j0 += 4) {
        switch (g - j0) {
        case 1: q8_scores(1, qf + j0, dq + j0, k, rb, nb, cell_pos, n, pos, scores + (size_t)j0 * n, mxs + j0); break;
        case 2: q8_scores(2, qf + j0, dq + j0, k, rb, nb, cell_pos, n, pos, scores + (size_t)j0 * n, mxs + j0); break;
        case 3: q8_scores(3, qf + j0, dq + j0, k, rb, nb, cell_pos, n, pos, scores + (size_t)j0 * n, mxs + j0); break;
        default: q8_scores(4, qf + j0, dq + j0, k, rb, nb, cell_pos, n, pos, scores + (size_t)j0 * n, mxs + j0); break;
        }
    }
    for (int32_t c = 0; c < n; c++)   /* V's block scales, once for every head */
        for (int b = 0; b < nb; b++) dv[b][c] = block_scale(v + (size_t)c * rb, b);
    float unit[EI_ATTN_MAX_GROUP][EI_ATTN_MAX_HD / 32];
    for (int j = 0; j < g; j++) {
        float *sc = scores + (size_t)j * n, *pj = part + (size_t)j * pf;
        const float mx = mxs[j];
        pj[0] = mx;
        pj[1] = 0.0f;
        if (mx == -INFINITY) continue;   /* visibility is the same for every head */
        pj[1] = exp_scores8(sc, n, mx);
        /* 15-bit weights per block (as floats) */
        for (int b = 0; b < nb; b++) {
            __m256 m8 = _mm256_setzero_ps();
            int32_t c = 0;
            for (; c + 8 <= n; c += 8) m8 = _mm256_max_ps(m8, _mm256_mul_ps(_mm256_loadu_ps(sc + c), _mm256_loadu_ps(dv[b] + c)));
            float wmax = hmax8(m8);
            for (; c < n; c++) wmax = fmaxf(wmax, sc[c] * dv[b][c]);
            const float inv = wmax > EI_ATTN_WMIN ? EI_ATTN_WMAX / wmax : 0.0f;
            const __m256 inv8 = _mm256_set1_ps(inv);
            for (c = 0; c + 8 <= n; c += 8)
                _mm256_storeu_ps(w[j][b] + c, _mm256_round_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(sc + c), _mm256_loadu_ps(dv[b] + c)), inv8),
                                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            for (; c < n; c++) w[j][b][c] = nearbyintf(sc[c] * dv[b][c] * inv);
            unit[j][b] = wmax / EI_ATTN_WMAX;
        }
    }
    if (mxs[0] == -INFINITY) {
        for (int j = 0; j < g; j++) memset(part + (size_t)j * pf + 2, 0, sizeof(float) * (size_t)hd);
        return;
    }
    /* V: one pass over the cells per 4 heads and 16 values */
    for (int j0 = 0; j0 < g; j0 += 4) {
        const int jn = g - j0 < 4 ? g - j0 : 4;
        for (int s0 = 0; s0 < 4 * nb; s0 += 2) {
            __m256 o[8];
            const float *scj = scores + (size_t)j0 * n, *wj = &w[j0][0][0];
            switch (jn) {
            case 1: heads_v_q8(1, s0, n, v, rb, scj, wj, w_head, o); break;
            case 2: heads_v_q8(2, s0, n, v, rb, scj, wj, w_head, o); break;
            case 3: heads_v_q8(3, s0, n, v, rb, scj, wj, w_head, o); break;
            default: heads_v_q8(4, s0, n, v, rb, scj, wj, w_head, o); break;
            }
            for (int j = 0; j < jn; j++) {
                const __m256 u = _mm256_set1_ps(unit[j0 + j][s0 / 4]);
                float *pj = part + (size_t)(j0 + j) * pf + 2 + 8 * s0;
                _mm256_storeu_ps(pj, _mm256_mul_ps(u, o[2 * j]));
                _mm256_storeu_ps(pj + 8, _mm256_mul_ps(u, o[2 * j + 1]));
            }
        }
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
