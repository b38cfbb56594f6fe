/* AVX-512 attention over one chunk of a Q8_0 KV arena: the algorithm of
 * chunk_q8_ref (attention.c), which tests/test_forward_kernels.py compares it with.
 *
 * Scores: for each block of 32 dimensions, the rows of 16 cells are transposed
 * in registers so that vector T_i holds dword i (4 int8) of all 16 cells; one
 * vpdpbusd per T_i and head then sums 16 cells at once, with no horizontal sums.
 * K is made unsigned (k + 128) for vpdpbusd; -128 * sum(q) undoes it.
 * V: two cells' rows are interleaved as int16 pairs and vpdpwssd adds both,
 * weighted by their 15-bit weights, into int32 accumulators. */
#include "attention.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "simd_math.h"

#define AVQ __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define AI static inline __attribute__((always_inline))
#define ROW_BYTES(nb) ((size_t)(nb) * 34)
#define MAX_NB (EI_ATTN_MAX_HD / 32) /* Q8_0 blocks of a head */

/* The f16 block scales of block b of 16 cells (rows cell0.., clamped to the chunk) as floats. */
AI AVQ __m512 block_scales(const uint8_t *base, __m512i row_offsets, int b) {
    const __m512i at = _mm512_add_epi32(row_offsets, _mm512_set1_epi32(34 * b));
    const __m512i raw = _mm512_i32gather_epi32(at, (const void *)base, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
}

/* Byte offsets of the rows of cells c..c+15, past the chunk's end clamped to its last row. */
AI AVQ __m512i row_offsets(int32_t c, int32_t n, size_t rb) {
    const __m512i cells = _mm512_min_epi32(_mm512_add_epi32(_mm512_set1_epi32(c), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
                                           _mm512_set1_epi32(n - 1));
    return _mm512_mullo_epi32(cells, _mm512_set1_epi32((int32_t)rb));
}

/* The rows of cells c..c+15 (those before end) on their way to L1: the transposed loads below
 * visit rows out of order, which the hardware prefetchers do not follow. */
AI AVQ void prefetch_rows(const uint8_t *base, int32_t c, int32_t end, size_t rb) {
    if (c >= end) return;
    const uint8_t *from = base + (size_t)c * rb, *to = base + (size_t)(c + 16 < end ? c + 16 : end) * rb;
    for (const uint8_t *p = from; p < to; p += 64) _mm_prefetch((const char *)p, _MM_HINT_T0);
}

/* T[i] = dword i of block b of cells c..c+15 (lane = cell), as unsigned bytes k + 128. */
AI AVQ void transpose_block(const uint8_t *k, int32_t c, int32_t n, size_t rb, int b, __m512i T[8]) {
    __m512i z[8];
    for (int m = 0; m < 8; m++) {   /* z[m] = [cell m | cell m + 8] */
        const int32_t lo = c + m < n ? c + m : n - 1, hi = c + m + 8 < n ? c + m + 8 : n - 1;
        const __m256i a = _mm256_loadu_si256((const __m256i *)(k + (size_t)lo * rb + 34 * b + 2));
        const __m256i h = _mm256_loadu_si256((const __m256i *)(k + (size_t)hi * rb + 34 * b + 2));
        z[m] = _mm512_inserti64x4(_mm512_castsi256_si512(a), h, 1);
    }
    /* an 8x8 dword transpose in each 256-bit half; each half then holds 8 cells of a dword pair */
    __m512i t[8], u[8];
    for (int m = 0; m < 4; m++) {
        t[2 * m] = _mm512_unpacklo_epi32(z[2 * m], z[2 * m + 1]);
        t[2 * m + 1] = _mm512_unpackhi_epi32(z[2 * m], z[2 * m + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);   /* dwords 0 | 4 */
        u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);   /* dwords 1 | 5 */
        u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);   /* dwords 2 | 6 */
        u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);   /* dwords 3 | 7 */
    }
    const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int i = 0; i < 4; i++) {
        T[i] = _mm512_xor_si512(_mm512_permutex2var_epi64(u[i], first, u[4 + i]), flip);
        T[i + 4] = _mm512_xor_si512(_mm512_permutex2var_epi64(u[i], second, u[4 + i]), flip);
    }
}

/* ei_attn_quantize_q, 16 values at a time (the same operations, so the same bytes). */
static AVQ void quantize_q(const float *q, int hd, float scale, int8_t *q8, float *dq, int32_t *qsum) {
    const __m512 sc = _mm512_set1_ps(scale), lim = _mm512_set1_ps(127.0f);
    for (int b = 0; b < hd / 32; b++) {
        const __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(q + 32 * b), sc), x1 = _mm512_mul_ps(_mm512_loadu_ps(q + 32 * b + 16), sc);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        const __m512 idv = _mm512_set1_ps(id);
        const __m512i r0 = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(_mm512_roundscale_ps(_mm512_mul_ps(x0, idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lim), _mm512_sub_ps(_mm512_setzero_ps(), lim)));
        const __m512i r1 = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(_mm512_roundscale_ps(_mm512_mul_ps(x1, idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lim), _mm512_sub_ps(_mm512_setzero_ps(), lim)));
        _mm_storeu_si128((__m128i *)(q8 + 32 * b), _mm512_cvtepi32_epi8(r0));
        _mm_storeu_si128((__m128i *)(q8 + 32 * b + 16), _mm512_cvtepi32_epi8(r1));
        dq[b] = d;
        qsum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1));
    }
}

/* Scores of g heads (quantized queries q8/dq/qsum, hd = 32 nb) for the chunk's n cells
 * into sc[j * n + c], -inf where not visible; mx[j] gets each head's maximum. */
static AVQ void q8_scores(const int8_t *q8, const float *dq, const int32_t *qsum, int g, const uint8_t *k, const uint8_t *v, int nb,
                          const int32_t *cell_pos, int32_t n, int32_t pos, float *sc, float *mx) {
    const size_t rb = ROW_BYTES(nb), hd = 32 * (size_t)nb;
    __m512 mxv[EI_ATTN_MAX_GROUP];
    for (int j = 0; j < g; j++) mxv[j] = _mm512_set1_ps(-INFINITY);
    /* past a whole chunk into the next one's first rows (a part chunk is the last used one,
     * as in the F16 kernel) */
    const int32_t pf_end = n == EI_ATTN_CHUNK ? n + 32 : n;
    for (int32_t c = 0; c < n; c += 16) {
        const __mmask16 valid = lanes_below(n - c);
        const __m512i offs = row_offsets(c, n, rb);
        prefetch_rows(k, c + 32, pf_end, rb);
        __m512 s[EI_ATTN_MAX_GROUP];
        for (int b = 0; b < nb; b++) {
            __m512i T[8];
            transpose_block(k, c, n, rb, b, T);
            const __m512 dk = block_scales(k, offs, b);
            for (int j = 0; j < g; j++) {
                const int8_t *qb = q8 + j * hd + 32 * b;
                __m512i acc = _mm512_set1_epi32(-128 * qsum[j * nb + b]);
                for (int i = 0; i < 8; i++) {
                    int32_t w;
                    memcpy(&w, qb + 4 * i, 4);
                    acc = _mm512_dpbusd_epi32(acc, T[i], _mm512_set1_epi32(w));
                }
                const __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(dq[j * nb + b]), dk), _mm512_cvtepi32_ps(acc));
                s[j] = b == 0 ? t : _mm512_add_ps(s[j], t);
            }
        }
        const __m512i cp = _mm512_mask_loadu_epi32(_mm512_set1_epi32(-1), valid, cell_pos + c);
        const __mmask16 vis = _mm512_mask_cmple_epi32_mask(_mm512_cmpge_epi32_mask(cp, _mm512_setzero_si512()), cp,
                                                            _mm512_set1_epi32(pos));
        for (int j = 0; j < g; j++) {
            const __m512 x = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), vis, s[j]);
            mxv[j] = _mm512_max_ps(mxv[j], x);
            _mm512_mask_storeu_ps(sc + (size_t)j * n + c, valid, x);
        }
    }
    for (int j = 0; j < g; j++) mx[j] = _mm512_reduce_max_ps(mxv[j]);
}

/* 15-bit weights w[c] = round(p[c] * dv[c] * WMAX / max) of one head and block; returns max / WMAX.
 * w has room for n rounded up to even; the pad is 0. */
static AVQ float q8_weights(const float *p, const float *dv, int32_t n, int16_t *w) {
    __m512 mx = _mm512_setzero_ps();
    for (int32_t c = 0; c < n; c += 16) {
        const __mmask16 valid = lanes_below(n - c);
        mx = _mm512_max_ps(mx, _mm512_mul_ps(_mm512_maskz_loadu_ps(valid, p + c), _mm512_maskz_loadu_ps(valid, dv + c)));
    }
    const float wmax = _mm512_reduce_max_ps(mx);
    const __m512 inv = _mm512_set1_ps(wmax > EI_ATTN_WMIN ? EI_ATTN_WMAX / wmax : 0.0f);
    for (int32_t c = 0; c < n; c += 16) {
        const __mmask16 valid = lanes_below(n - c);
        const __m512 x = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(valid, p + c), _mm512_maskz_loadu_ps(valid, dv + c)), inv);
        _mm256_mask_storeu_epi16(w + c, valid, _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(x)));
    }
    if (n & 1) w[n] = 0;
    return wmax / EI_ATTN_WMAX;
}

/* Is cell c or c + 1 (if in the chunk) visible? */
AI AVQ int visible2(const int32_t *cell_pos, int32_t c, int32_t n, int32_t pos) {
    return ei_attn_visible(cell_pos[c], pos) || (c + 1 < n && ei_attn_visible(cell_pos[c + 1], pos));
}

/* V summed for JN heads (weights w[j][b][c], row stride wst) over the chunk into the
 * partials' o (hd = 32 NB), scaled by unit[j][b]. JN and NB are constants where inlined. */
AI AVQ void q8_values(const int JN, const int NB, const uint8_t *v, size_t rb, int32_t n, const int32_t *cell_pos, int32_t pos,
                      const int16_t *w, size_t wst, const float *unit, float *part, int pf) {
    __m512i lo[4][8], hi[4][8];   /* [head][block]: dims 8L+0..3 and 8L+4..7 of 128-bit lane L */
    for (int j = 0; j < JN; j++)
        for (int b = 0; b < NB; b++) lo[j][b] = hi[j][b] = _mm512_setzero_si512();
    for (int32_t c = 0; c < n; c += 2) {
        if (!visible2(cell_pos, c, n, pos)) continue;   /* neither cell visible: weight 0 for every head */
        const uint8_t *ra = v + (size_t)c * rb, *rn = v + (size_t)(c + 1 < n ? c + 1 : c) * rb;
        for (int b = 0; b < NB; b++) {
            const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(ra + 34 * b + 2)));
            const __m512i d = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(rn + 34 * b + 2)));
            const __m512i xl = _mm512_unpacklo_epi16(a, d), xh = _mm512_unpackhi_epi16(a, d);
            for (int j = 0; j < JN; j++) {
                int32_t pair;
                memcpy(&pair, w + j * wst * NB + b * wst + c, 4);
                const __m512i pw = _mm512_set1_epi32(pair);
                lo[j][b] = _mm512_dpwssd_epi32(lo[j][b], xl, pw);
                hi[j][b] = _mm512_dpwssd_epi32(hi[j][b], xh, pw);
            }
        }
    }
    const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for (int j = 0; j < JN; j++)
        for (int b = 0; b < NB; b++) {
            const __m512 u = _mm512_set1_ps(unit[j * NB + b]);
            float *o = part + j * pf + 2 + 32 * b;
            _mm512_storeu_ps(o, _mm512_mul_ps(u, _mm512_cvtepi32_ps(_mm512_permutex2var_epi64(lo[j][b], first, hi[j][b]))));
            _mm512_storeu_ps(o + 16, _mm512_mul_ps(u, _mm512_cvtepi32_ps(_mm512_permutex2var_epi64(lo[j][b], second, hi[j][b]))));
        }
}

/* V for other head sizes (96, 384, 512, ...): one head at a time, in runs of 8 blocks, then
 * of 1. Not inlined, so that the constant shapes' registers are left alone. */
static __attribute__((noinline)) AVQ void q8_values_any(int jn, int nb, const uint8_t *v, size_t rb, int32_t n,
                                                         const int32_t *cell_pos, int32_t pos, const int16_t *w,
                                                         size_t wst, const float *unit, float *part, int pf) {
    for (int j = 0; j < jn; j++)
        for (int b = 0; b < nb;) {
            const uint8_t *vb = v + 34 * b;
            const int16_t *wb = w + (j * nb + b) * wst;
            const float *ub = unit + j * nb + b;
            float *ob = part + (size_t)j * pf + 32 * b;
            if (nb - b >= 8) {
                q8_values(1, 8, vb, rb, n, cell_pos, pos, wb, wst, ub, ob, pf);
                b += 8;
            } else {
                q8_values(1, 1, vb, rb, n, cell_pos, pos, wb, wst, ub, ob, pf);
                b++;
            }
        }
}

AVQ void ei_attend_chunk_q8_avx512(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                                   int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part) {
    (void)n_cells;   /* Q8_0 K is rows */
    const int nb = hd / 32, pf = EI_ATTN_PART_FLOATS(hd);
    const int32_t n = c1 - c0;
    const size_t rb = ROW_BYTES(nb);
    k += (size_t)c0 * rb;
    v += (size_t)c0 * rb;
    cell_pos += c0;
    int8_t q8[EI_ATTN_MAX_GROUP * EI_ATTN_MAX_HD];
    float dq[EI_ATTN_MAX_GROUP * MAX_NB], mx[EI_ATTN_MAX_GROUP], sum[EI_ATTN_MAX_GROUP];
    int32_t qsum[EI_ATTN_MAX_GROUP * MAX_NB];
    for (int j = 0; j < g; j++) quantize_q(q + (size_t)j * hd, hd, scale, q8 + j * hd, dq + j * nb, qsum + j * nb);
    mx[0] = -INFINITY;
    q8_scores(q8, dq, qsum, g, k, v, nb, cell_pos, n, pos, scores, mx);
    if (!ei_attn_any_visible(cell_pos, n, pos)) {   /* visibility is the same for every head */
        ei_attn_empty_parts(part, g, hd);
        return;
    }
    for (int j = 0; j < g; j++) {
        sum[j] = exp_scores16(scores + (size_t)j * n, n, mx[j]);
        part[j * pf] = mx[j];
        part[j * pf + 1] = sum[j];
    }
    /* V's block scales, once for every head, read row after row: this is the chunk's first
     * touch of V, which gathers made wait on memory (1.15-1.28x on a decode's attention at depth
     * 4096 with the prefetch past the chunk above, Zen 4, scripts/bench_attention.c) */
    float dv[MAX_NB][EI_ATTN_CHUNK];
    uint16_t dvh[MAX_NB][EI_ATTN_CHUNK];
    for (int32_t c = 0; c < n; c++)
        for (int b = 0; b < nb; b++) memcpy(&dvh[b][c], v + (size_t)c * rb + 34 * b, 2);
    for (int32_t c = 0; c < n; c += 16)
        for (int b = 0; b < nb; b++)
            _mm512_storeu_ps(dv[b] + c, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes_below(n - c), dvh[b] + c)));
    /* heads in tiles whose int32 accumulators (2 per head and block) fit the registers */
    const int tile = nb <= 2 ? 4 : nb == 4 ? 2 : 1;
    enum { WST = EI_ATTN_CHUNK + 2, WROWS = MAX_NB > 8 ? MAX_NB : 8 };   /* tile * nb rows: at most max(8, nb) */
    int16_t w[WROWS * WST];
    float unit[WROWS];
    for (int j0 = 0; j0 < g; j0 += tile) {
        const int jn = g - j0 < tile ? g - j0 : tile;
        for (int j = 0; j < jn; j++)
            for (int b = 0; b < nb; b++)
                unit[j * nb + b] = q8_weights(scores + (size_t)(j0 + j) * n, dv[b], n, w + (j * nb + b) * WST);
        float *pt = part + (size_t)j0 * pf;
        switch (nb * 8 + jn) {
        case 1 * 8 + 1: q8_values(1, 1, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 1 * 8 + 2: q8_values(2, 1, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 1 * 8 + 3: q8_values(3, 1, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 1 * 8 + 4: q8_values(4, 1, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 2 * 8 + 1: q8_values(1, 2, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 2 * 8 + 2: q8_values(2, 2, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 2 * 8 + 3: q8_values(3, 2, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 2 * 8 + 4: q8_values(4, 2, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 4 * 8 + 1: q8_values(1, 4, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 4 * 8 + 2: q8_values(2, 4, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        case 8 * 8 + 1: q8_values(1, 8, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        default: q8_values_any(jn, nb, v, rb, n, cell_pos, pos, w, WST, unit, pt, pf); break;
        }
    }
}
#endif
