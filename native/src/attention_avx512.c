/* AVX-512 attention over one chunk of an F16 KV arena (the contract is ei_attend_chunk's).
 *
 * Why it is faster than the AVX2 kernel: each cell's K and V rows are turned
 * into floats once and used by every query head of the GQA group (a tile of up
 * to 4 heads), and the scores of 16 cells are summed by one shuffle tree
 * instead of a horizontal sum per cell. The scalar kernel in attention.c is the
 * reference; tests/test_forward_kernels.py compares the two. */
#include "attention.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "edgeinfer.h"
#include "simd_math.h"

#define AV5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define AI static inline __attribute__((always_inline))
#define MAX_TILE 4 /* query heads per tile */
#define MAX_NV (EI_ATTN_MAX_HD / 16) /* 16-float vectors of a head (past 16 they spill, still vector) */

/* Values 16i..16i+15 of an F16 KV row as floats. */
AI AV5 __m512 ld16(const uint8_t *row, int i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 32 * i)));
}

/* The shuffle tree. Level 1 takes two cells' 16 partial sums and returns
 * [cell a: 8 | cell b: 8]; level 2 gives 4 cells x 4 (one per 128-bit lane);
 * level 3 gives pairs per lane; level 4 leaves cell k + 4m at lane 4k + m. */
AI AV5 __m512 tree1(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
AI AV5 __m512 tree2(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}
AI AV5 __m512 tree3(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
}
AI AV5 __m512 tree4(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

/* Scores (scaled, -inf where not visible) of JN heads for the chunk's n cells,
 * into sc[j * n + c]; mx[j] gets each head's maximum. */
AI AV5 void tile_scores(const float *q, const int JN, const uint8_t *k, const int NV, size_t rb,
                        const int32_t *cell_pos, int32_t n, int32_t pos, float scale, float *sc, float *mx) {
    __m512 qv[MAX_TILE][MAX_NV], mxv[MAX_TILE];
    for (int j = 0; j < JN; j++) {
        mxv[j] = _mm512_set1_ps(-INFINITY);
        for (int i = 0; i < NV; i++) qv[j][i] = _mm512_mul_ps(_mm512_loadu_ps(q + (16 * NV) * j + 16 * i), _mm512_set1_ps(scale));
    }
    const __m512i natural = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int32_t b = 0; b < n; b += 16) {
        __m512 quad[MAX_TILE][4];
        for (int qd = 0; qd < 4; qd++) {
            __m512 pair[MAX_TILE][2];
            for (int pr = 0; pr < 2; pr++) {
                __m512 cell[MAX_TILE][2];
                for (int e = 0; e < 2; e++) {
                    int32_t c = b + 4 * qd + 2 * pr + e;
                    if (c >= n) c = n - 1; /* past the end: any row, masked below */
                    const uint8_t *kr = k + (size_t)c * rb;
                    __m512 kz[MAX_NV];
                    for (int i = 0; i < NV; i++) kz[i] = ld16(kr, i);
                    for (int j = 0; j < JN; j++) {
                        __m512 a = _mm512_mul_ps(kz[0], qv[j][0]);
                        for (int i = 1; i < NV; i++) a = _mm512_fmadd_ps(kz[i], qv[j][i], a);
                        cell[j][e] = a;
                    }
                }
                for (int j = 0; j < JN; j++) pair[j][pr] = tree1(cell[j][0], cell[j][1]);
            }
            for (int j = 0; j < JN; j++) quad[j][qd] = tree2(pair[j][0], pair[j][1]);
        }
        const __mmask16 valid = lanes_below(n - b);
        const __m512i cp = _mm512_mask_loadu_epi32(_mm512_set1_epi32(-1), valid, cell_pos + b);
        const __mmask16 vis = _mm512_mask_cmple_epi32_mask(_mm512_cmpge_epi32_mask(cp, _mm512_setzero_si512()), cp,
                                                            _mm512_set1_epi32(pos));
        for (int j = 0; j < JN; j++) {
            __m512 s = tree4(tree3(quad[j][0], quad[j][1]), tree3(quad[j][2], quad[j][3]));
            s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis, _mm512_permutexvar_ps(natural, s));
            mxv[j] = _mm512_max_ps(mxv[j], s);
            _mm512_mask_storeu_ps(sc + (size_t)j * n + b, valid, s);
        }
    }
    for (int j = 0; j < JN; j++) mx[j] = _mm512_reduce_max_ps(mxv[j]);
}

AI AV5 void attend_tile(const float *q, const int JN, const uint8_t *k, const uint8_t *v, const int NV,
                        const int32_t *cell_pos, int32_t n, int32_t pos, float scale, float *sc, float *part) {
    const int hd = 16 * NV, pf = EI_ATTN_PART_FLOATS(hd);
    const size_t rb = (size_t)hd * 2;
    float mx[MAX_TILE], sum[MAX_TILE];
    tile_scores(q, JN, k, NV, rb, cell_pos, n, pos, scale, sc, mx);
    if (!ei_attn_any_visible(cell_pos, n, pos)) {   /* visibility is the same for every head */
        ei_attn_empty_parts(part, JN, hd);
        return;
    }
    for (int j = 0; j < JN; j++) sum[j] = exp_scores16(sc + (size_t)j * n, n, mx[j]);
    __m512 acc[MAX_TILE][MAX_NV];
    for (int j = 0; j < JN; j++)
        for (int i = 0; i < NV; i++) acc[j][i] = _mm512_setzero_ps();
    for (int32_t c = 0; c < n; c++) {
        if (!ei_attn_visible(cell_pos[c], pos)) continue; /* not visible: weight 0 for every head */
        const uint8_t *vr = v + (size_t)c * rb;
        __m512 vz[MAX_NV];
        for (int i = 0; i < NV; i++) vz[i] = ld16(vr, i);
        for (int j = 0; j < JN; j++) {
            const __m512 p = _mm512_set1_ps(sc[(size_t)j * n + c]);
            for (int i = 0; i < NV; i++) acc[j][i] = _mm512_fmadd_ps(p, vz[i], acc[j][i]);
        }
    }
    for (int j = 0; j < JN; j++) {
        part[j * pf] = mx[j];
        part[j * pf + 1] = sum[j];
        for (int i = 0; i < NV; i++) _mm512_storeu_ps(part + j * pf + 2 + 16 * i, acc[j][i]);
    }
}

#define TILE(JN, NV) attend_tile(qj, JN, k, v, NV, cell_pos, n, pos, scale, scj, partj)

AV5 void ei_attend_chunk_avx512(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                                int32_t c0, int32_t c1, int32_t pos, int hd, float scale, float *scores, float *part) {
    const int nv = hd / 16, pf = EI_ATTN_PART_FLOATS(hd);
    const int32_t n = c1 - c0;
    k += (size_t)c0 * hd * 2;
    v += (size_t)c0 * hd * 2;
    cell_pos += c0;
    /* heads per tile so that a tile's query and accumulator vectors fit the 32 registers */
    const int per_tile = nv == 4 ? 4 : nv == 8 ? 2 : 1;
    for (int j0 = 0; j0 < g; j0 += per_tile) {
        const int jn = g - j0 < per_tile ? g - j0 : per_tile;
        const float *qj = q + (size_t)j0 * hd;
        float *scj = scores + (size_t)j0 * n, *partj = part + (size_t)j0 * pf;
        if (nv == 4) {   /* constant tile shapes keep queries and accumulators in registers */
            switch (jn) {
            case 1: TILE(1, 4); break;
            case 2: TILE(2, 4); break;
            case 3: TILE(3, 4); break;
            default: TILE(4, 4); break;
            }
        } else if (nv == 8) {
            if (jn == 1) TILE(1, 8);
            else TILE(2, 8);
        } else {
            TILE(1, nv);
        }
    }
}
#endif
