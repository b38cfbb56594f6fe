#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "edgeinfer.h"
#include "common.h"
#include "kernels.h"
#include "simd_math.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* One F16 KV row (head_dim values) as floats. */
static void f16_row_ref(const uint8_t *row, int hd, float *out) {
    for (int i = 0; i < hd; i++) {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        out[i] = ei_fp16_to_fp32(h);
    }
}

void ei_kv_store_row(const ei_kernels *k, int kv_type, const float *x, int hd, uint8_t *row) {
    if (kv_type == EI_TYPE_F16) {
        k->to_f16(x, hd, (uint16_t *)row);   /* rows are 2-byte aligned: cells of hd halves */
        return;
    }
    block_q8_0 *blk = (block_q8_0 *)row;
    for (int b = 0; b < hd / QK; b++, blk++, x += QK) {
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        blk->d = ei_fp32_to_fp16(amax / 127.0f);
        const float d = ei_fp16_to_fp32(blk->d), id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < QK; i++) {
            const float r = nearbyintf(x[i] * id);
            blk->qs[i] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
        }
    }
}

void ei_k_cell_io(int kv_type, uint8_t *k, int32_t cell, int32_t n_cells, int hd, uint8_t *row, int save) {
    if (kv_type != EI_TYPE_F16) {
        const size_t rb = (size_t)ei_row_bytes(kv_type, hd);
        memcpy(save ? row : k + (size_t)cell * rb, save ? k + (size_t)cell * rb : row, rb);
        return;
    }
    uint16_t *kh = (uint16_t *)k, *r = (uint16_t *)row;
    for (int d = 0; d < hd; d++) {
        uint16_t *at = kh + ei_kt_index(cell, d, hd, n_cells);
        if (save) r[d] = *at;
        else *at = r[d];
    }
}

void ei_k_store(const ei_kernels *k, int kv_type, const float *x, int hd, uint8_t *arena, int32_t cell,
                int32_t n_cells) {
    if (kv_type != EI_TYPE_F16) {
        ei_kv_store_row(k, kv_type, x, hd, arena + (size_t)cell * ei_row_bytes(kv_type, hd));
        return;
    }
    uint16_t row[1024];
    k->to_f16(x, hd, row);
    ei_k_cell_io(kv_type, arena, cell, n_cells, hd, (uint8_t *)row, 0);
}

size_t ei_k_prefix_cells(int kv_type, int32_t n, int32_t n_cells) {
    if (kv_type != EI_TYPE_F16) return (size_t)n;
    const int32_t whole = (n + EI_KT - 1) / EI_KT * EI_KT;
    return (size_t)(whole < n_cells ? whole : n_cells);
}

/* ---- scalar references ---- */

/* F16 K/V: float scores and float accumulation over the rows as stored. */
static void chunk_ref(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                      int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part) {
    const int32_t n = c1 - c0;
    const size_t rb = (size_t)hd * 2;
    float row[1024];
    for (int j = 0; j < g; j++) {
        const float *qj = q + (size_t)j * hd;
        float *sc = scores + (size_t)j * n, *pj = part + (size_t)j * EI_ATTN_PART_FLOATS(hd);
        float mx = -INFINITY;
        for (int32_t c = 0; c < n; c++) {
            if (!ei_attn_visible(cell_pos[c0 + c], pos)) {
                sc[c] = -INFINITY;
                continue;
            }
            float s = 0.0f;
            for (int i = 0; i < hd; i++)
                s += ei_fp16_to_fp32(((const uint16_t *)k)[ei_kt_index(c0 + c, i, hd, n_cells)]) * qj[i];
            sc[c] = s * scale;
            if (sc[c] > mx) mx = sc[c];
        }
        ei_attn_empty_parts(pj, 1, hd);
        if (mx == -INFINITY) continue;
        float sum = 0.0f;
        for (int32_t c = 0; c < n; c++) {
            if (sc[c] == -INFINITY) continue;
            const float p = expf(sc[c] - mx);
            sum += p;
            f16_row_ref(v + (size_t)(c0 + c) * rb, hd, row);
            for (int i = 0; i < hd; i++) pj[2 + i] += p * row[i];
        }
        pj[0] = mx;
        pj[1] = sum;
    }
}

void ei_attn_quantize_q(const float *q, int hd, float scale, int8_t *q8, float *dq, int32_t *qsum) {
    for (int b = 0; b < hd / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(q[32 * b + i] * scale));
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            const float r = nearbyintf(q[32 * b + i] * scale * id);
            q8[32 * b + i] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
            sum += q8[32 * b + i];
        }
        dq[b] = d;
        qsum[b] = sum;
    }
}

/* Q8_0 K/V, as llama.cpp attends over a quantized KV cache: the query is quantized to
 * Q8_0 blocks and dotted with K in integers; V is accumulated in integers against the
 * softmax weights times V's block scales, quantized to 15 bits per head and block
 * (EI_ATTN_WMAX at the chunk's largest weight). Every step is exact integer arithmetic
 * or one float operation in a fixed order, so a SIMD kernel matches this one up to
 * the last bits of exp(). */
static void chunk_q8_ref(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                         int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part) {
    const int32_t n = c1 - c0;
    const int nb = hd / QK;
    const size_t rb = (size_t)nb * sizeof(block_q8_0);
    int8_t q8[1024];
    float dq[32];
    int32_t qsum[32], acc[32];
    k += (size_t)c0 * rb;
    v += (size_t)c0 * rb;
    for (int j = 0; j < g; j++) {
        float *sc = scores + (size_t)j * n, *pj = part + (size_t)j * EI_ATTN_PART_FLOATS(hd);
        ei_attn_quantize_q(q + (size_t)j * hd, hd, scale, q8, dq, qsum);
        float mx = -INFINITY;
        for (int32_t c = 0; c < n; c++) {
            if (!ei_attn_visible(cell_pos[c0 + c], pos)) {
                sc[c] = -INFINITY;
                continue;
            }
            const block_q8_0 *kr = (const block_q8_0 *)(k + (size_t)c * rb);
            float s = 0.0f;
            for (int b = 0; b < nb; b++) {
                int32_t dot = 0;
                for (int i = 0; i < QK; i++) dot += (int32_t)q8[QK * b + i] * kr[b].qs[i];
                s += (dq[b] * ei_fp16_to_fp32(kr[b].d)) * (float)dot;
            }
            sc[c] = s;
            if (s > mx) mx = s;
        }
        ei_attn_empty_parts(pj, 1, hd);
        if (mx == -INFINITY) continue;
        float sum = 0.0f;
        for (int32_t c = 0; c < n; c++) {
            sc[c] = sc[c] == -INFINITY ? 0.0f : expf(sc[c] - mx);
            sum += sc[c];
        }
        for (int b = 0; b < nb; b++) {
            float wmax = 0.0f;
            for (int32_t c = 0; c < n; c++) wmax = fmaxf(wmax, sc[c] * ei_attn_q8_scale(v + (size_t)c * rb, b));
            const float inv = wmax > EI_ATTN_WMIN ? EI_ATTN_WMAX / wmax : 0.0f;
            for (int i = 0; i < 32; i++) acc[i] = 0;
            for (int32_t c = 0; c < n; c++) {
                const block_q8_0 *vb = (const block_q8_0 *)(v + (size_t)c * rb) + b;
                const int32_t w = (int32_t)nearbyintf(sc[c] * ei_fp16_to_fp32(vb->d) * inv);
                for (int i = 0; w && i < QK; i++) acc[i] += w * vb->qs[i];
            }
            for (int i = 0; i < 32; i++) pj[2 + 32 * b + i] = (wmax / EI_ATTN_WMAX) * (float)acc[i];
        }
        pj[0] = mx;
        pj[1] = sum;
    }
}

#if defined(__x86_64__)
#define AV __attribute__((target("avx2,fma,f16c")))

/* Values 8i..8i+7 of an F16 KV row as floats. */
static inline __attribute__((always_inline)) AV __m256 ld_kv8(const uint8_t *row, int i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 16 * i)));
}

/* Scores of JN heads for U K tiles (2 x JN x U chains of 8 cells): cell c's score is one FMA chain
 * over d of qs[j * hd + d] (head j's query times scale) times value d of c; each tile row is
 * turned into floats once for all JN heads. acc[(j * U + u) * 2 + half]. */
static inline __attribute__((always_inline)) AV void tiles_scores8(const float *qs, const int JN, const int U,
                                                                   const uint8_t *const *tile, const int hd,
                                                                   __m256 *acc) {
    for (int u = 0; u < U; u++) {
        const __m256 k0 = ld_kv8(tile[u], 0), k1 = ld_kv8(tile[u], 1);
        for (int j = 0; j < JN; j++) {
            const __m256 qd = _mm256_set1_ps(qs[j * hd]);
            acc[(j * U + u) * 2] = _mm256_mul_ps(qd, k0);
            acc[(j * U + u) * 2 + 1] = _mm256_mul_ps(qd, k1);
        }
    }
    for (int d = 1; d < hd; d++)
        for (int u = 0; u < U; u++) {
            const __m256 k0 = ld_kv8(tile[u], 2 * d), k1 = ld_kv8(tile[u], 2 * d + 1);
            for (int j = 0; j < JN; j++) {
                const __m256 qd = _mm256_set1_ps(qs[j * hd + d]);
                acc[(j * U + u) * 2] = _mm256_fmadd_ps(qd, k0, acc[(j * U + u) * 2]);
                acc[(j * U + u) * 2 + 1] = _mm256_fmadd_ps(qd, k1, acc[(j * U + u) * 2 + 1]);
            }
        }
}

/* Scores (scaled, -inf where not visible) of JN heads over the chunk's n cells (c0 + c of the K
 * arena k of n_cells cells) into sc[j * n + c], U tiles a pass; mx[j] gets head j's maximum. */
static inline __attribute__((always_inline)) AV void heads_scores8(const float *q, const int JN, const int U,
                                                                   const uint8_t *k, int32_t c0, int32_t n_cells,
                                                                   const int32_t *cell_pos, int32_t n, int32_t pos,
                                                                   const int hd, float scale, float *sc, float *mx) {
    float qs[4 * EI_ATTN_MAX_HD];
    uint16_t pad[EI_KT * EI_ATTN_MAX_HD];
    __m256 mxv[4];
    for (int j = 0; j < JN; j++) {
        mxv[j] = _mm256_set1_ps(-INFINITY);
        for (int d = 0; d < hd; d++) qs[j * hd + d] = q[(size_t)j * hd + d] * scale;
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), posv = _mm256_set1_epi32(pos);
    for (int32_t b = 0, ut; b < n; b += ut * EI_KT) {
        ut = (n - b + EI_KT - 1) / EI_KT >= U ? U : 1;
        const uint8_t *tile[4];
        for (int u = 0; u < ut; u++) tile[u] = ei_kt_tile(k, c0 + b + u * EI_KT, n_cells, hd, pad);
        __m256 acc[16];
        if (ut == U) tiles_scores8(qs, JN, U, tile, hd, acc);
        else tiles_scores8(qs, JN, 1, tile, hd, acc);
        for (int i = 0; i < 2 * ut && b + 8 * i < n; i++) {   /* 8 cells: -inf where not visible or past n */
            const int32_t c = b + 8 * i;
            const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - c), lane);
            const __m256i cp = _mm256_maskload_epi32(cell_pos + c, live);
            const __m256i hidden = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), cp),
                                                   _mm256_cmpgt_epi32(cp, posv));
            const __m256 vis = _mm256_castsi256_ps(_mm256_andnot_si256(hidden, live));
            for (int j = 0; j < JN; j++) {   /* acc[(j * ut + u) * 2 + half], i = 2u + half */
                const __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), acc[j * ut * 2 + i], vis);
                mxv[j] = _mm256_max_ps(mxv[j], x);
                if (c + 8 <= n) _mm256_storeu_ps(sc + (size_t)j * n + c, x);   /* AMD's masked store is slow */
                else _mm256_maskstore_ps(sc + (size_t)j * n + c, live, x);
            }
        }
    }
    for (int j = 0; j < JN; j++) mx[j] = hmax8(mxv[j]);
}

/* One V row (cell) times its JV weights w[j * n] into the JV x NS accumulators of values
 * [8 * s0, 8 * (s0 + NS)), each V vector turned into floats once for the JV heads. */
static inline __attribute__((always_inline)) AV void v_cell(const float *w, const int JV, const int NS, int s0,
                                                            int32_t n, const uint8_t *vc, __m256 (*a)[8]) {
    __m256 vz[8];
    for (int i = 0; i < NS; i++) vz[i] = ld_kv8(vc, s0 + i);
    for (int j = 0; j < JV; j++) {
        const __m256 x = _mm256_set1_ps(w[(size_t)j * n]);
        for (int i = 0; i < NS; i++) a[j][i] = _mm256_fmadd_ps(x, vz[i], a[j][i]);
    }
}

/* o[j] = sum over the n cells of weight w[j * n + c] times V row c, for JV heads and values
 * [8 * s0, 8 * (s0 + NS)). A cell whose JV weights are all 0 is skipped; a weight of 0 beside
 * others adds 0, so a head's sum is the same in any grouping. The zero test is one vector compare
 * per 8 cells: tested cell by cell it cost as much as the cell's FMAs. */
static inline __attribute__((always_inline)) AV void heads_v8(const float *w, const int JV, const int NS, int s0,
                                                              int32_t n, const uint8_t *v, const int hd,
                                                              float *const *o) {
    __m256 a[4][8];
    for (int j = 0; j < JV; j++)
        for (int i = 0; i < NS; i++) a[j][i] = _mm256_setzero_ps();
    const size_t rb = (size_t)hd * 2;
    int32_t c = 0;
    for (; c + 8 <= n; c += 8) {   /* 8 cells a step, their "any weight not 0" as bits */
        /* the first pass streams V: 16 rows ahead, 1.3x at depth 4096 (Zen 4, this kernel); past the
         * chunk only if it is whole, as ei_attend_chunk_avx512's K */
        if (s0 == 0 && (c + 24 <= n || n == EI_ATTN_CHUNK))
            for (size_t p = 0; p < 8 * rb; p += 64) _mm_prefetch((const char *)v + (c + 16) * rb + p, _MM_HINT_T0);
        __m256 nz = _mm256_setzero_ps();
        for (int j = 0; j < JV; j++)
            nz = _mm256_or_ps(nz, _mm256_cmp_ps(_mm256_loadu_ps(w + (size_t)j * n + c), _mm256_setzero_ps(),
                                                _CMP_NEQ_UQ));
        const int live = _mm256_movemask_ps(nz);
        if (live == 0xff) {
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) v_cell(w + c + i, JV, NS, s0, n, v + (c + i) * rb, a);
        } else {
            for (int i = 0; i < 8; i++)
                if (live >> i & 1) v_cell(w + c + i, JV, NS, s0, n, v + (c + i) * rb, a);
        }
    }
    for (; c < n; c++) {
        int any = 0;
        for (int j = 0; j < JV; j++) any |= w[(size_t)j * n + c] != 0.0f;
        if (any) v_cell(w + c, JV, NS, s0, n, v + c * rb, a);
    }
    for (int j = 0; j < JV; j++)
        for (int i = 0; i < NS; i++) _mm256_storeu_ps(o[j] + 8 * (s0 + i), a[j][i]);
}

/* heads_v8 over all hd values, 8 accumulators a pass, 9 or 12 for 3 or 4 heads (fewer at the end
 * when hd / 8 does not divide into passes). 12 rather than 8 for 3 and 4 heads: 1.08-1.10x at head
 * sizes 64 and 128 (AMD Zen 3; 2 heads then ran 0.95x, their code unchanged). */
static inline __attribute__((always_inline)) AV void heads_v(const float *w, const int JV, int32_t n,
                                                             const uint8_t *v, const int hd, float *const *o) {
    const int NS = JV == 1 ? 8 : JV == 2 ? 4 : 3;
    int s0 = 0;
    for (; s0 + NS <= hd / 8; s0 += NS) heads_v8(w, JV, NS, s0, n, v, hd, o);
    for (; s0 + 2 <= hd / 8; s0 += 2) heads_v8(w, JV, 2, s0, n, v, hd, o);
    for (; s0 < hd / 8; s0++) heads_v8(w, JV, 1, s0, n, v, hd, o);
}

/* F16 K/V, hd a multiple of 8, at most EI_ATTN_MAX_HD: the scores of up to 4 heads at once (8 FMA
 * chains), a vector exp pass per head, then V for two heads at a time. Inlined with a constant hd
 * for the common head sizes so the loops unroll. */
static inline __attribute__((always_inline)) AV void chunk_avx2_body(
    const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos, int32_t c0, int32_t c1,
    int32_t n_cells, int32_t pos, const int hd, float scale, float *scores, float *part) {
    const int32_t n = c1 - c0;
    v += (size_t)c0 * hd * 2;
    cell_pos += c0;
    for (int j0 = 0; j0 < g; j0 += 4) {
        const int jn = EI_MIN(4, g - j0);
        const float *qj = q + (size_t)j0 * hd;
        float *scj = scores + (size_t)j0 * n, mx[4];
        switch (jn) {   /* tiles a pass: 8 chains or more */
        case 1: heads_scores8(qj, 1, 4, k, c0, n_cells, cell_pos, n, pos, hd, scale, scj, mx); break;
        case 2: heads_scores8(qj, 2, 2, k, c0, n_cells, cell_pos, n, pos, hd, scale, scj, mx); break;
        case 3:   /* 2 + 1 heads: 3 x 1 tile is only 6 chains */
            heads_scores8(qj, 2, 2, k, c0, n_cells, cell_pos, n, pos, hd, scale, scj, mx);
            heads_scores8(qj + 2 * hd, 1, 4, k, c0, n_cells, cell_pos, n, pos, hd, scale, scj + 2 * n, mx + 2);
            break;
        default: heads_scores8(qj, 4, 1, k, c0, n_cells, cell_pos, n, pos, hd, scale, scj, mx); break;
        }
        for (int j = 0; j < jn; j++) {
            float *pj = part + (size_t)(j0 + j) * EI_ATTN_PART_FLOATS(hd);
            ei_attn_empty_parts(pj, 1, hd);
            if (mx[j] == -INFINITY) continue;   /* visibility is the same for every head */
            pj[1] = exp_scores8(scj + (size_t)j * n, n, mx[j]);
            pj[0] = mx[j];
        }
        if (mx[0] == -INFINITY) continue;
        float *o[4];
        for (int j = 0; j < jn; j++) o[j] = part + (size_t)(j0 + j) * EI_ATTN_PART_FLOATS(hd) + 2;
        switch (jn) {   /* V for all the heads at once: 4 x 2 accumulators */
        case 1: heads_v(scj, 1, n, v, hd, o); break;
        case 2: heads_v(scj, 2, n, v, hd, o); break;
        case 3: heads_v(scj, 3, n, v, hd, o); break;
        default: heads_v(scj, 4, n, v, hd, o); break;
        }
    }
}

/* Any other head size, in a function of its own: inlined with the others, its frame took
 * registers from their loops. */
static __attribute__((noinline)) AV void chunk_avx2_any(const float *q, int g, const uint8_t *k, const uint8_t *v,
                                                       const int32_t *cell_pos, int32_t c0, int32_t c1,
                                                       int32_t n_cells, int32_t pos, int hd, float scale,
                                                       float *scores, float *part) {
    chunk_avx2_body(q, g, k, v, cell_pos, c0, c1, n_cells, pos, hd, scale, scores, part);
}

AV void ei_attend_chunk_avx2(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                             int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part) {
    switch (hd) {   /* constant head sizes keep the accumulators in registers */
    case 64: chunk_avx2_body(q, g, k, v, cell_pos, c0, c1, n_cells, pos, 64, scale, scores, part); break;
    case 128: chunk_avx2_body(q, g, k, v, cell_pos, c0, c1, n_cells, pos, 128, scale, scores, part); break;
    case 256: chunk_avx2_body(q, g, k, v, cell_pos, c0, c1, n_cells, pos, 256, scale, scores, part); break;
    default: chunk_avx2_any(q, g, k, v, cell_pos, c0, c1, n_cells, pos, hd, scale, scores, part); break;
    }
}
#endif

ei_attn_kernel ei_attn_pick(const ei_kernels *k, int kv_type, int hd) {
    const ei_attn_kernel *c = k->attend[kv_type == EI_TYPE_Q8_0];
    for (int i = 0; i < EI_ATTN_CANDIDATES && c[i].fn; i++)
        if (hd % c[i].hd_mult == 0 && hd <= c[i].hd_max) return c[i];
    return (ei_attn_kernel){kv_type == EI_TYPE_Q8_0 ? chunk_q8_ref : chunk_ref, 1, 1024, 0};
}

/* The end of cells [c0, c1) once the cells at its end that a query at pos cannot see are dropped:
 * they weigh nothing, and in a prefill they are the later tokens of the batch, so dropping them
 * halves its score work on average. */
static int32_t visible_end(const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t pos) {
    while (c1 > c0 && !ei_attn_visible(cell_pos[c1 - 1], pos)) c1--;
    return c1;
}

void ei_attend_chunk(const ei_attn_kernel *a, const float *q, int g, const uint8_t *k, const uint8_t *v,
                     const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale,
                     float *scores, float *part) {
    c1 = visible_end(cell_pos, c0, c1, pos);
    if (c1 == c0) {
        ei_attn_empty_parts(part, g, hd);
        return;
    }
    const int step = a->max_group ? a->max_group : g;
    for (int j0 = 0; j0 < g; j0 += step)
        a->fn(q + (size_t)j0 * hd, EI_MIN(step, g - j0), k, v, cell_pos, c0, c1, n_cells, pos, hd, scale,
              scores + (size_t)j0 * (c1 - c0), part + (size_t)j0 * EI_ATTN_PART_FLOATS(hd));
}

void ei_attend_chunk_pair(const ei_attn_kernel *a, const float *const q[2], int g, const uint8_t *k, const uint8_t *v,
                          const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t n_cells, const int32_t pos[2],
                          int hd, float scale, float *scores, float *const part[2]) {
    if (!a->pair) {
        for (int t = 0; t < 2; t++)
            ei_attend_chunk(a, q[t], g, k, v, cell_pos, c0, c1, n_cells, pos[t], hd, scale, scores, part[t]);
        return;
    }
    /* the cells hidden from both (cells hidden from only the earlier token weigh nothing for it:
     * its partial keeps its bits) */
    c1 = visible_end(cell_pos, c0, c1, pos[0] > pos[1] ? pos[0] : pos[1]);
    if (c1 == c0) {
        for (int t = 0; t < 2; t++) ei_attn_empty_parts(part[t], g, hd);
        return;
    }
    a->pair(q, g, k, v, cell_pos, c0, c1, n_cells, pos, hd, scale, scores, part);
}

/* out and the partials never overlap (restrict), so the loops over hd vectorize: each lane does the
 * scalar loop's multiplies and add in order, the same bits. */
void ei_attend_merge(const float *restrict parts, int n_chunks, int64_t part_stride, int hd, float *restrict out) {
    float m = -INFINITY, s = 0.0f;
    for (int i = 0; i < hd; i++) out[i] = 0.0f;
    for (int c = 0; c < n_chunks; c++) {
        const float *restrict p = parts + c * part_stride;
        if (p[0] == -INFINITY) continue;
        const float mn = p[0] > m ? p[0] : m;
        const float a = m == -INFINITY ? 0.0f : expf(m - mn), b = expf(p[0] - mn);
        const float *restrict pv = p + 2;
        for (int i = 0; i < hd; i++) out[i] = out[i] * a + pv[i] * b;
        s = s * a + p[1] * b;
        m = mn;
    }
    if (s > 0.0f) {
        const float inv = 1.0f / s;
        for (int i = 0; i < hd; i++) out[i] *= inv;
    }
}

/* ei_kernel_attention for nt (1 or 2) tokens: two go through ei_attend_chunk_pair, as a prefill
 * pairs them. */
static ei_status kernel_attention(int isa, const float *const *q, int nt, int g, const void *k, const void *v,
                                  int kv_type, const int32_t *cell_pos, int32_t n_cells, const int32_t *pos, int hd,
                                  float *const *out) {
    if (!q[0] || !q[nt - 1] || !k || !v || !cell_pos || !out[0] || !out[nt - 1] || g < 1 || n_cells < 1 || hd < 1 ||
        hd > 1024)
        return ei_fail(EI_ERR_INVALID_ARG, "kernel_attention: bad arguments");
    if (kv_type != EI_TYPE_F16 && !(kv_type == EI_TYPE_Q8_0 && hd % 32 == 0))
        return ei_fail(EI_ERR_UNSUPPORTED, "kernel_attention: KV type %d with head_dim %d", kv_type, hd);
    const ei_kernels *kt = ei_kernels_get(isa);
    if (!kt) return ei_fail(EI_ERR_UNSUPPORTED, "ISA %d not supported here", isa);
    const ei_attn_kernel a = ei_attn_pick(kt, kv_type, hd);
    const int n_chunks = (n_cells + EI_ATTN_CHUNK - 1) / EI_ATTN_CHUNK, pf = EI_ATTN_PART_FLOATS(hd);
    const size_t rb = (size_t)ei_row_bytes(kv_type, hd), tok_parts = (size_t)n_chunks * g * pf;
    float *scores = malloc(sizeof(float) * 2 * (size_t)g * EI_ATTN_CHUNK);
    float *parts = malloc(sizeof(float) * nt * tok_parts);
    uint8_t *arena = malloc(rb * (size_t)n_cells);   /* k's rows as the runtime keeps K */
    if (!scores || !parts || !arena) {
        free(scores);
        free(parts);
        free(arena);
        return ei_fail(EI_ERR_OUT_OF_MEMORY, "kernel_attention: out of memory");
    }
    for (int32_t c = 0; c < n_cells; c++)
        ei_k_cell_io(kv_type, arena, c, n_cells, hd, (uint8_t *)k + (size_t)c * rb, 0);
    const float scale = 1.0f / sqrtf((float)hd);
    for (int c = 0; c < n_chunks; c++) {
        const int32_t c0 = c * EI_ATTN_CHUNK, c1 = (int32_t)((int64_t)c0 + EI_ATTN_CHUNK < n_cells ? c0 + EI_ATTN_CHUNK : n_cells);
        float *part[2] = {parts + (size_t)c * g * pf, parts + tok_parts + (size_t)c * g * pf};
        if (nt == 2) ei_attend_chunk_pair(&a, q, g, arena, v, cell_pos, c0, c1, n_cells, pos, hd, scale, scores, part);
        else ei_attend_chunk(&a, q[0], g, arena, v, cell_pos, c0, c1, n_cells, pos[0], hd, scale, scores, part[0]);
    }
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < g; j++)
            ei_attend_merge(parts + t * tok_parts + (size_t)j * pf, n_chunks, (int64_t)g * pf, hd, out[t] + (size_t)j * hd);
    free(scores);
    free(parts);
    free(arena);
    return EI_OK;
}

ei_status ei_kernel_attention(int isa, const float *q, int g, const void *k, const void *v, int kv_type,
                              const int32_t *cell_pos, int32_t n_cells, int32_t pos, int hd, float *out) {
    return kernel_attention(isa, &q, 1, g, k, v, kv_type, cell_pos, n_cells, &pos, hd, &out);
}

ei_status ei_kernel_attention_pair(int isa, const float *q0, const float *q1, int g, const void *k, const void *v,
                                   int kv_type, const int32_t *cell_pos, int32_t n_cells, int32_t pos0, int32_t pos1,
                                   int hd, float *out0, float *out1) {
    const float *q[2] = {q0, q1};
    const int32_t pos[2] = {pos0, pos1};
    float *out[2] = {out0, out1};
    return kernel_attention(isa, q, 2, g, k, v, kv_type, cell_pos, n_cells, pos, hd, out);
}
