/* AVX-512 attention over one chunk of an F16 KV arena (the contract is ei_attend_chunk's).
 *
 * Why it is faster than the AVX2 kernel: the scores of a tile of up to 4 query heads of the GQA
 * group share each K tile row (16 cells of one value, attention.h), with up to 8 tiles a pass so
 * enough FMA chains are in flight; each V row is turned into floats once for the whole tile of
 * heads. The scalar kernel in attention.c is the reference; tests/test_forward_kernels.py
 * compares the two. */
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
#define MAX_U 8 /* K tiles a pass */

/* Values 16i..16i+15 of an F16 KV row as floats. */
AI AV5 __m512 ld16(const uint8_t *row, int i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 32 * i)));
}

/* Scores of JN heads for U tiles of EI_KT cells: per value d, one broadcast query value times the
 * tile's row d for each (head, tile), so each cell's score is one FMA chain over d; JN x U chains
 * hide the FMA latency. qs[j * hd + d] is head j's query times scale. The next pass's tiles (at
 * next) are prefetched a slice per value: so much arithmetic per byte leaves the hardware
 * prefetchers too few loads to run far enough ahead (1.3x on a decode's attention at depth 4096,
 * Zen 4). */
AI AV5 void tiles_scores(const float *qs, const int JN, const int U, const uint8_t *const *tile, const int hd,
                         const uint8_t *next, __m512 acc[MAX_TILE][MAX_U]) {
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

/* Scores (scaled, -inf where not visible) of JN heads for the chunk's n cells (t0 + c of the
 * K arena k of n_cells cells), into sc[j * n + c]; mx[j] gets each head's maximum. */
AI AV5 void tile_scores(const float *q, const int JN, const uint8_t *k, const int hd, int32_t t0, int32_t n_cells,
                        const int32_t *cell_pos, int32_t n, int32_t pos, float scale, float *sc, float *mx) {
    /* tiles a pass: 8 or more FMA chains (4 cycles each, 2 issued a cycle on Intel). Four for two to
     * four heads: AMD Zen 4 ran the scores of a hot chunk 1.14x faster at four heads than with two
     * tiles, 1.04x at three (three tiles), the same at two; the 1B shape's prefill attention 1.13x */
    const int U = JN == 1 ? 8 : 4;
    float qs[MAX_TILE * EI_ATTN_MAX_HD];
    uint16_t pad[EI_KT * EI_ATTN_MAX_HD];
    __m512 mxv[MAX_TILE];
    for (int j = 0; j < JN; j++) {
        mxv[j] = _mm512_set1_ps(-INFINITY);
        for (int d = 0; d < hd; d++) qs[j * hd + d] = q[j * hd + d] * scale;
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
        __m512 acc[MAX_TILE][MAX_U];
        if (ut == U) tiles_scores(qs, JN, U, tile, hd, next, acc);
        else tiles_scores(qs, JN, 1, tile, hd, next, acc);
        for (int u = 0; u < ut; u++) {
            const int32_t c = b + u * EI_KT;
            const __mmask16 valid = lanes_below(n - c);
            const __m512i cp = _mm512_mask_loadu_epi32(_mm512_set1_epi32(-1), valid, cell_pos + c);
            const __mmask16 vis = _mm512_mask_cmple_epi32_mask(_mm512_cmpge_epi32_mask(cp, _mm512_setzero_si512()), cp,
                                                                _mm512_set1_epi32(pos));
            for (int j = 0; j < JN; j++) {
                const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis, acc[j][u]);
                mxv[j] = _mm512_max_ps(mxv[j], s);
                _mm512_mask_storeu_ps(sc + (size_t)j * n + c, valid, s);
            }
        }
    }
    for (int j = 0; j < JN; j++) mx[j] = _mm512_reduce_max_ps(mxv[j]);
}

AI AV5 void attend_tile(const float *q, const int JN, const uint8_t *k, const uint8_t *v, const int NV, int32_t t0,
                        int32_t n_cells, const int32_t *cell_pos, int32_t n, int32_t pos, float scale, float *sc,
                        float *part) {
    const int hd = 16 * NV, pf = EI_ATTN_PART_FLOATS(hd);
    const size_t rb = (size_t)hd * 2;
    float mx[MAX_TILE], sum[MAX_TILE];
    tile_scores(q, JN, k, hd, t0, n_cells, cell_pos, n, pos, scale, sc, mx);
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

#define TILE(JN, NV) attend_tile(qj, JN, k, v, NV, c0, n_cells, cell_pos, n, pos, scale, scj, partj)

AV5 void ei_attend_chunk_avx512(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                                int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part) {
    const int nv = hd / 16, pf = EI_ATTN_PART_FLOATS(hd);
    const int32_t n = c1 - c0;
    v += (size_t)c0 * hd * 2;
    cell_pos += c0;
    /* heads per tile so that a tile's V accumulators fit the 32 registers */
    const int per_tile = nv == 4 ? 4 : nv == 8 ? 2 : 1;
    for (int j0 = 0; j0 < g; j0 += per_tile) {
        const int jn = g - j0 < per_tile ? g - j0 : per_tile;
        const float *qj = q + (size_t)j0 * hd;
        float *scj = scores + (size_t)j0 * n, *partj = part + (size_t)j0 * pf;
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
#endif
