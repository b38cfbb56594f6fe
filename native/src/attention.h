/* Attention over a slot's KV ring: f16 K/V, f32 queries and accumulation.
 *
 * The cells of a slot are cut into fixed chunks of EI_ATTN_CHUNK cells. Each
 * chunk yields a partial softmax (max, sum, weighted V) for every query head
 * of a GQA group; partials are merged in chunk order. The chunking depends
 * only on the cell count, never on the batch or the thread count, so a
 * token's result is the same however it is scheduled (batch invariance),
 * while a single decoded token still spreads over all threads. */
#ifndef EI_ATTENTION_H
#define EI_ATTENTION_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "kernels.h"

#define EI_ATTN_CHUNK 256
#define EI_ATTN_MAX_GROUP 8 /* query heads an x86 Q8_0 SIMD kernel takes in one call */
/* The largest head a SIMD kernel takes (Gemma 4's full layers); their per-head arrays are
 * sized by it. Larger heads (up to 1024) go to the scalar reference. */
#define EI_ATTN_MAX_HD 512
/* The Q8_0 kernels sum V in int32: a chunk of 256 cells x |weight| 32767 x |v| 128 fits. */
_Static_assert((long long)EI_ATTN_CHUNK * 32767 * 128 <= 2147483647LL, "Q8_0 V sums overflow int32");

/* F16 K is kept in tiles of EI_KT cells, transposed: a tile holds value d of its cells side by
 * side ([d][cell]), so a score is one FMA chain per cell with the cells across the vector and no
 * horizontal sum, and decode and prefill read it alike. An arena of n_cells cells ends in a tile
 * of n_cells % EI_KT cells when that is not 0 ([d][its cells]). Q8_0 K and all V are rows. */
#define EI_KT 16

/* Index (in halves from cell 0) of value d of cell c in an F16 K arena of n_cells cells. */
static inline size_t ei_kt_index(int32_t c, int d, int hd, int32_t n_cells) {
    const int32_t t0 = c & ~(EI_KT - 1), w = n_cells - t0 < EI_KT ? n_cells - t0 : EI_KT;
    return (size_t)t0 * hd + (size_t)d * w + (size_t)(c - t0);
}

/* The tile of cells [t0, t0 + EI_KT) as EI_KT-wide: in place when whole, else the arena's last
 * tile copied into pad ([d][EI_KT] halves, the missing cells 0). */
static inline const uint8_t *ei_kt_tile(const uint8_t *k, int32_t t0, int32_t n_cells, int hd, uint16_t *pad) {
    const uint16_t *tile = (const uint16_t *)k + (size_t)t0 * hd;
    const int32_t w = n_cells - t0;
    if (w >= EI_KT) return (const uint8_t *)tile;
    for (int d = 0; d < hd; d++)
        for (int c = 0; c < EI_KT; c++) pad[d * EI_KT + c] = c < w ? tile[d * w + c] : 0;
    return (const uint8_t *)pad;
}

/* Partial result of one chunk (c1 - c0 <= EI_ATTN_CHUNK cells) for one query head: m (max score), s (sum of
 * exp(score - m)), then o[hd] = sum exp(score - m) * V. m = -inf if no cell
 * of the chunk is visible. */
#define EI_ATTN_PART_FLOATS(hd) ((hd) + 2)

/* Query heads q[j * hd ...], j < g, all reading the same K/V (one GQA group);
 * k and v point at cell 0 of arenas of n_cells cells: V one row of the KV type per cell (F16 or
 * Q8_0, the type `a` was picked for), K the same for Q8_0 and in EI_KT tiles for F16. c0 is a
 * multiple of EI_KT. Cells [c0, c1) with 0 <= cell_pos[c] <= pos are visible. scores needs
 * g * (c1 - c0) floats; part gets g partials of EI_ATTN_PART_FLOATS(hd). Groups wider than a->max_group go in slices. */
void ei_attend_chunk(const ei_attn_kernel *a, const float *q, int g, const uint8_t *k, const uint8_t *v,
                     const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale,
                     float *scores, float *part);

/* ei_attend_chunk for two tokens of one slot (q[t], pos[t], part[t]) in one pass over the chunk
 * where the kernel has a two-token form, else one after the other: the same bits either way.
 * scores needs 2 * g * (c1 - c0) floats. */
void ei_attend_chunk_pair(const ei_attn_kernel *a, const float *const q[2], int g, const uint8_t *k, const uint8_t *v,
                          const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t n_cells, const int32_t pos[2],
                          int hd, float scale, float *scores, float *const part[2]);

/* The attention kernel of table k for a KV type and head size: the first of the
 * table's SIMD kernels that takes hd, else the scalar reference (hd <= 1024). */
ei_attn_kernel ei_attn_pick(const ei_kernels *k, int kv_type, int hd);

/* Q8_0 K/V follow llama.cpp's quantized-KV attention (see chunk_q8_ref in attention.c):
 * the query quantized to Q8_0 blocks by this function, integer dots with K, and V summed
 * in integers against softmax weights quantized to EI_ATTN_WMAX per head and block. */
#define EI_ATTN_WMAX 32767.0f
/* A block whose largest weight is below this adds < 1e-26 to the output: it is dropped
 * (weights 0) rather than scaled by WMAX / wmax, which would overflow to inf. */
#define EI_ATTN_WMIN 1e-30f
void ei_attn_quantize_q(const float *q, int hd, float scale, int8_t *q8, float *dq, int32_t *qsum);

/* The f16 scale of block b of a Q8_0 KV row. */
static inline float ei_attn_q8_scale(const uint8_t *row, int b) {
    return ei_fp16_to_fp32(((const block_q8_0 *)row)[b].d);
}

/* The SIMD kernels kernels.c puts in the tables (AVX-512: hd a multiple of 16, AVX2 F16: of 8,
 * NEON F16: of 4, Q8_0: of 32; all at most EI_ATTN_MAX_HD). */
void ei_attend_chunk_avx2(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                          int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part);
void ei_attend_chunk_avx512(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                            int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part);
void ei_attend_pair_avx512(const float *const q[2], int g, const uint8_t *k, const uint8_t *v,
                           const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t n_cells, const int32_t pos[2],
                           int hd, float scale, float *scores, float *const part[2]);
void ei_attend_chunk_neon(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                          int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part);
void ei_attend_chunk_q8_neon(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                             int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part);
void ei_attend_chunk_q8_avx2(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                             int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part);
void ei_attend_chunk_q8_avx512(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                               int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part);

/* Is a cell holding position cp visible to a query at pos? (-1 marks an empty cell.) */
static inline int ei_attn_visible(int32_t cp, int32_t pos) { return cp >= 0 && cp <= pos; }

/* Any visible cell among cell_pos[0..n)? */
static inline int ei_attn_any_visible(const int32_t *cell_pos, int32_t n, int32_t pos) {
    for (int32_t c = 0; c < n; c++)
        if (ei_attn_visible(cell_pos[c], pos)) return 1;
    return 0;
}

/* g partials (m = -inf, s = 0, o = 0) for a chunk with no visible cell. */
static inline void ei_attn_empty_parts(float *part, int g, int hd) {
    for (int j = 0; j < g; j++) {
        float *p = part + (size_t)j * EI_ATTN_PART_FLOATS(hd);
        p[0] = -INFINITY;
        for (int i = 1; i < EI_ATTN_PART_FLOATS(hd); i++) p[i] = 0.0f;
    }
}

/* Writes hd floats as one KV row of kv_type (F16, or Q8_0 blocks: d = amax / 127): V's cells. */
void ei_kv_store_row(const ei_kernels *k, int kv_type, const float *x, int hd, uint8_t *row);
/* The same into cell `cell` of a K arena of n_cells cells (F16: into its tile). */
void ei_k_store(const ei_kernels *k, int kv_type, const float *x, int hd, uint8_t *arena, int32_t cell,
                int32_t n_cells);
/* Cell `cell` of a K arena as one row of kv_type, out (save) or back in (!save). */
void ei_k_cell_io(int kv_type, uint8_t *arena, int32_t cell, int32_t n_cells, int hd, uint8_t *row, int save);
/* The cells whose bytes lead a K arena up to cell n (whole tiles for F16): copying that many rows'
 * bytes copies cells [0, n). */
size_t ei_k_prefix_cells(int kv_type, int32_t n, int32_t n_cells);

/* out[hd] = the normalized attention output from n_chunks partials of one head
 * (part_stride floats apart), merged in order. */
void ei_attend_merge(const float *restrict parts, int n_chunks, int64_t part_stride, int hd, float *restrict out);
#endif
