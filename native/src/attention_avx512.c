/* AVX-512 attention over one chunk of an F16 KV arena (the contract is ei_attend_chunk's).
 *
 * Why it is faster than the AVX2 kernel: the scores of a tile of up to 4 query heads of the GQA
 * group share each K tile row (16 cells of one value, attention.h), with up to 8 tiles a pass so
 * enough FMA chains are in flight; each V row is turned into floats once for the whole tile of
 * heads. A prefill's tokens come two at a time (ei_attend_pair_avx512): one pass over K for both,
 * and the chunk still in the cache for the second one's V. The scalar kernel in attention.c is the
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
#define MAX_ROWS (2 * MAX_TILE) /* score rows: a tile's heads for up to two tokens */
#define MAX_NV (EI_ATTN_MAX_HD / 16) /* 16-float vectors of a head (past 16 they spill, still vector) */
#define MAX_U 8 /* K tiles a pass */

/* Values 16i..16i+15 of an F16 KV row as floats. */
AI AV5 __m512 ld16(const uint8_t *row, int i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 32 * i)));
}

/* Scores of JN rows (query heads, of one token or two) for U tiles of EI_KT cells: per value d, one
 * broadcast query value times the tile's row d for each (row, tile), so each cell's score is one FMA
 * chain over d; JN x U chains hide the FMA latency. qs[j * hd + d] is row j's query times scale. The next pass's tiles (at
 * next) are prefetched a slice per value: so much arithmetic per byte leaves the hardware
 * prefetchers too few loads to run far enough ahead (1.3x on a decode's attention at depth 4096,
 * Zen 4). */
AI AV5 void tiles_scores(const float *qs, const int JN, const int U, const uint8_t *const *tile, const int hd,
                         const uint8_t *next, __m512 acc[MAX_ROWS][MAX_U]) {
    const int slice = U * EI_KT * 2;   /* bytes of the pass per value d */
    for (int p = 0; p < slice; p += 64) _mm_prefetch((const char *)next + p, _MM_HINT_T0);
    for (int u = 0; u < U; u++) {
        const __m512 kz = ld16(tile[u], 0);
        for (int j = 0; j < JN; j++) acc[j][u] = _mm512_mul_ps(_mm512_set1_ps(qs[j * hd]), kz);
    }
    for (int d = 1; d < hd; d++) {
        for (int p = 0; p < slice; p += 64) _mm_prefetch((const char *)next + d * slice + p, _MM_HINT_T0);
        for (int u = 0; u < U; u++) {
            const __m512 kz = ld16(tile[u], d);
            for (int j = 0; j < JN; j++) acc[j][u] = _mm512_fmadd_ps(_mm512_set1_ps(qs[j * hd + d]), kz, acc[j][u]);
        }
    }
}

/* Scores (scaled, -inf where not visible) of TN tokens' JN heads each (row r = t * JN + j: token
 * t's head j, query q[t] + j * hd, position pos[t]) for the chunk's n cells (t0 + c of the K arena
 * k of n_cells cells), into sc[r * n + c]; mx[r] gets each row's maximum. A row's scores are the
 * same bits whatever the other rows are. */
AI AV5 void tile_scores(const float *const *q, const int TN, const int JN, const uint8_t *k, const int hd, int32_t t0,
                        int32_t n_cells, const int32_t *cell_pos, int32_t n, const int32_t *pos, float scale, float *sc,
                        float *mx) {
    const int R = TN * JN;
    /* tiles a pass: about 8 FMA chains or more (4 cycles each, 2 issued a cycle on Intel). On a hot
     * chunk (AMD Zen 4, one thread) 6 and 8 rows ran fastest with one tile, 2 to 4 rows with four
     * (1.14x against two tiles at 4 rows); one row keeps eight */
    const int U = R >= 6 ? 1 : R == 1 ? 8 : 4;
    float qs[MAX_ROWS * EI_ATTN_MAX_HD];
    uint16_t pad[EI_KT * EI_ATTN_MAX_HD];
    __m512 mxv[MAX_ROWS];
    for (int r = 0; r < R; r++) {
        mxv[r] = _mm512_set1_ps(-INFINITY);
        for (int d = 0; d < hd; d++) qs[r * hd + d] = q[r / JN][(r % JN) * hd + d] * scale;
    }
    for (int32_t b = 0, ut; b < n; b += ut * EI_KT) {
        ut = (n - b + EI_KT - 1) / EI_KT >= U ? U : 1;
        const uint8_t *tile[MAX_U];
        for (int u = 0; u < ut; u++)
            tile[u] = ei_kt_tile(k, t0 + b + u * EI_KT, n_cells, hd, pad);
        /* the arena's tiles after this pass; past the chunk's end, the next chunk's only if this
         * one is whole (a part chunk is the last used one: prefetching the unused cells past it
         * made a short decode in a 4K context 0.73x, cause not pinned down) */
        const int more = b + ut * EI_KT < n || n == EI_ATTN_CHUNK;
        const uint8_t *next = more ? k + (size_t)(t0 + b + ut * EI_KT) * hd * 2 : tile[0];
        __m512 acc[MAX_ROWS][MAX_U];
        if (ut == U) tiles_scores(qs, R, U, tile, hd, next, acc);
        else tiles_scores(qs, R, 1, tile, hd, next, acc);
        for (int u = 0; u < ut; u++) {
            const int32_t c = b + u * EI_KT;
            const __mmask16 valid = lanes_below(n - c);
            const __m512i cp = _mm512_mask_loadu_epi32(_mm512_set1_epi32(-1), valid, cell_pos + c);
            const __mmask16 filled = _mm512_cmpge_epi32_mask(cp, _mm512_setzero_si512());
            for (int t = 0; t < TN; t++) {
                const __mmask16 vis = _mm512_mask_cmple_epi32_mask(filled, cp, _mm512_set1_epi32(pos[t]));
                for (int j = t * JN; j < (t + 1) * JN; j++) {
                    const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis, acc[j][u]);
                    mxv[j] = _mm512_max_ps(mxv[j], s);
                    _mm512_mask_storeu_ps(sc + (size_t)j * n + c, valid, s);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) mx[r] = _mm512_reduce_max_ps(mxv[r]);
}

/* One tile of JN heads for TN tokens (q[t], pos[t], part[t]): the scores of all TN * JN rows in one
 * pass over K, then each token's softmax and V sum (a tile's V accumulators fill the registers). */
AI AV5 void attend_tile(const float *const *q, const int TN, const int JN, const uint8_t *k, const uint8_t *v,
                        const int NV, int32_t t0, int32_t n_cells, const int32_t *cell_pos, int32_t n,
                        const int32_t *pos, float scale, float *sc, float *const *part) {
    const int hd = 16 * NV, pf = EI_ATTN_PART_FLOATS(hd);
    const size_t rb = (size_t)hd * 2;
    float mx[MAX_ROWS];
    tile_scores(q, TN, JN, k, hd, t0, n_cells, cell_pos, n, pos, scale, sc, mx);
    for (int t = 0; t < TN; t++) {
        float *st = sc + (size_t)t * JN * n;
        float *pt = part[t];
        if (!ei_attn_any_visible(cell_pos, n, pos[t])) {   /* visibility is the same for every head */
            ei_attn_empty_parts(pt, JN, hd);
            continue;
        }
        float sum[MAX_TILE];
        for (int j = 0; j < JN; j++) sum[j] = exp_scores16(st + (size_t)j * n, n, mx[t * JN + j]);
        __m512 acc[MAX_TILE][MAX_NV];
        for (int j = 0; j < JN; j++)
            for (int i = 0; i < NV; i++) acc[j][i] = _mm512_setzero_ps();
        for (int32_t c = 0; c < n; c++) {
            if (!ei_attn_visible(cell_pos[c], pos[t])) continue; /* not visible: weight 0 for every head */
            const uint8_t *vr = v + (size_t)c * rb;
            __m512 vz[MAX_NV];
            for (int i = 0; i < NV; i++) vz[i] = ld16(vr, i);
            for (int j = 0; j < JN; j++) {
                const __m512 p = _mm512_set1_ps(st[(size_t)j * n + c]);
                for (int i = 0; i < NV; i++) acc[j][i] = _mm512_fmadd_ps(p, vz[i], acc[j][i]);
            }
        }
        for (int j = 0; j < JN; j++) {
            pt[j * pf] = mx[t * JN + j];
            pt[j * pf + 1] = sum[j];
            for (int i = 0; i < NV; i++) _mm512_storeu_ps(pt + j * pf + 2 + 16 * i, acc[j][i]);
        }
    }
}

#define TILE(JN, NV) attend_tile(qj, TN, JN, k, v, NV, c0, n_cells, cell_pos, n, pos, scale, scj, partj)

/* TN tokens (1 or 2) of one GQA group over the chunk: scores needs TN * g * (c1 - c0) floats. */
AI AV5 void attend_chunk(const float *const *q, const int TN, int g, const uint8_t *k, const uint8_t *v,
                         const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t n_cells, const int32_t *pos, int hd,
                         float scale, float *scores, float *const *part) {
    const int nv = hd / 16, pf = EI_ATTN_PART_FLOATS(hd);
    const int32_t n = c1 - c0;
    v += (size_t)c0 * hd * 2;
    cell_pos += c0;
    /* heads per tile so that a tile's V accumulators fit the 32 registers */
    const int per_tile = nv == 4 ? 4 : nv == 8 ? 2 : 1;
    for (int j0 = 0; j0 < g; j0 += per_tile) {
        const int jn = g - j0 < per_tile ? g - j0 : per_tile;
        const float *qj[2];
        float *partj[2];
        for (int t = 0; t < TN; t++) qj[t] = q[t] + (size_t)j0 * hd, partj[t] = part[t] + (size_t)j0 * pf;
        float *scj = scores + (size_t)j0 * TN * n;
        if (nv == 4) {   /* constant tile shapes keep the accumulators in registers */
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

AV5 void ei_attend_chunk_avx512(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                                int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part) {
    attend_chunk(&q, 1, g, k, v, cell_pos, c0, c1, n_cells, &pos, hd, scale, scores, &part);
}

/* Two tokens at once: each K value is turned into floats once for both rows of a head. On a hot
 * chunk (AMD Zen 4, one thread) 1.07x a token for groups of 4 heads of 64, 1.11x for 3, 1.13-1.17x
 * for heads of 128; from memory 1.22x (4 heads of 64). */
AV5 void ei_attend_pair_avx512(const float *const q[2], int g, const uint8_t *k, const uint8_t *v,
                               const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t n_cells, const int32_t pos[2],
                               int hd, float scale, float *scores, float *const part[2]) {
    attend_chunk(q, 2, g, k, v, cell_pos, c0, c1, n_cells, pos, hd, scale, scores, part);
}
#endif
