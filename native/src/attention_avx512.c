/* AVX-512 attention over one chunk (the contract is ei_attend_chunk's).
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
#include "kernels.h"
#include "simd_math.h"

#define AV5 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define AI static inline __attribute__((always_inline))
#define MAX_TILE 4 /* query heads per tile */

/* Values 16i..16i+15 of a KV row as floats: F16, or half a Q8_0 block. */
AI AV5 __m512 ld16(const uint8_t *row, int i, const int kv) {
    if (kv == EI_TYPE_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 32 * i)));
    const uint8_t *blk = row + 34 * (i >> 1);
    uint16_t dh;
    memcpy(&dh, blk, 2);
    const __m512i qi = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + 16 * (i & 1))));
    return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(dh)), _mm512_cvtepi32_ps(qi));
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

AI AV5 __mmask16 lanes_below(int32_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* Scores (scaled, -inf where not visible) of JN heads for the chunk's n cells,
 * into sc[j * n + c]; mx[j] gets each head's maximum. */
AI AV5 void tile_scores(const float *q, const int JN, const uint8_t *k, const int kv, const int NV, size_t rb,
                        const int32_t *cell_pos, int32_t n, int32_t pos, float scale, float *sc, float *mx) {
    __m512 qv[MAX_TILE][16], mxv[MAX_TILE];
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
                    __m512 kz[16];
                    for (int i = 0; i < NV; i++) kz[i] = ld16(kr, i, kv);
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

/* Scores -> exp(score - mx), 0 where not visible; returns their sum. */
AI AV5 float exp_scores(float *sc, int32_t n, float mx) {
    const __m512 mxv = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    for (int32_t c = 0; c < n; c += 16) {
        const __mmask16 valid = lanes_below(n - c);
        const __m512 x = _mm512_maskz_loadu_ps(valid, sc + c);
        const __mmask16 live = _mm512_mask_cmp_ps_mask(valid, x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        const __m512 e = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(x, mxv)));
        _mm512_mask_storeu_ps(sc + c, valid, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

AI AV5 void attend_tile(const float *q, const int JN, const uint8_t *k, const uint8_t *v, const int kv, const int NV,
                        const int32_t *cell_pos, int32_t n, int32_t pos, float scale, float *sc, float *part) {
    const int hd = 16 * NV, pf = EI_ATTN_PART_FLOATS(hd);
    const size_t rb = kv == EI_TYPE_F16 ? (size_t)hd * 2 : (size_t)hd / 32 * 34;
    float mx[MAX_TILE], sum[MAX_TILE];
    tile_scores(q, JN, k, kv, NV, rb, cell_pos, n, pos, scale, sc, mx);
    if (mx[0] == -INFINITY) { /* visibility is the same for every head */
        for (int j = 0; j < JN; j++) {
            part[j * pf] = -INFINITY;
            part[j * pf + 1] = 0.0f;
            memset(part + j * pf + 2, 0, sizeof(float) * (size_t)hd);
        }
        return;
    }
    for (int j = 0; j < JN; j++) sum[j] = exp_scores(sc + (size_t)j * n, n, mx[j]);
    __m512 acc[MAX_TILE][16];
    for (int j = 0; j < JN; j++)
        for (int i = 0; i < NV; i++) acc[j][i] = _mm512_setzero_ps();
    for (int32_t c = 0; c < n; c++) {
        if (sc[c] == 0.0f) continue; /* not visible (a visible cell's weight is >= 1e-38) */
        const uint8_t *vr = v + (size_t)c * rb;
        __m512 vz[16];
        for (int i = 0; i < NV; i++) vz[i] = ld16(vr, i, kv);
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

/* Heads per tile so that a tile's query and accumulator vectors fit the 32 registers. */
static int tile_heads(int nv) { return nv <= 4 ? 4 : nv <= 8 ? 2 : 1; }

#define TILE(KV, JN, NV) attend_tile(qj, JN, k, v, KV, NV, cell_pos, n, pos, scale, scj, partj)
#define TILES_FOR_HD(KV, NV)                       \
    switch (jn) {                                  \
    case 1: TILE(KV, 1, NV); break;                \
    case 2: TILE(KV, 2, NV); break;                \
    case 3: TILE(KV, 3, NV); break;                \
    default: TILE(KV, 4, NV); break;               \
    }
#define DISPATCH(KV)                                                          \
    switch (nv) {                                                             \
    case 4: TILES_FOR_HD(KV, 4) break;                                        \
    case 8: if (jn == 1) TILE(KV, 1, 8); else TILE(KV, 2, 8); break;          \
    default: TILE(KV, 1, nv); break;                                          \
    }

AV5 void ei_attend_chunk_avx512(const float *q, int g, const uint8_t *k, const uint8_t *v, int kv_type,
                                const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t pos, int hd, float scale,
                                float *scores, float *part) {
    const int nv = hd / 16, pf = EI_ATTN_PART_FLOATS(hd);
    const int32_t n = c1 - c0;
    const size_t rb = (size_t)ei_row_bytes(kv_type, hd);
    k += (size_t)c0 * rb;
    v += (size_t)c0 * rb;
    cell_pos += c0;
    const int per_tile = nv == 4 || nv == 8 ? tile_heads(nv) : 1;
    for (int j0 = 0; j0 < g; j0 += per_tile) {
        const int jn = g - j0 < per_tile ? g - j0 : per_tile;
        const float *qj = q + (size_t)j0 * hd;
        float *scj = scores + (size_t)j0 * n, *partj = part + (size_t)j0 * pf;
        if (kv_type == EI_TYPE_F16) {
            DISPATCH(EI_TYPE_F16)
        } else {
            DISPATCH(EI_TYPE_Q8_0)
        }
    }
}
#endif
