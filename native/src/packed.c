#include "packed.h"

#include <stddef.h>
#include <string.h>

#include "packed_zmm.h"
#include "quants_impl.h"

static int quant_bytes(int type) {
    switch (type) {
    case EI_TYPE_Q4_0:
    case EI_TYPE_Q4_1:
    case EI_TYPE_IQ4_NL: return 128;   /* IQ4_NL: table indices, Q4_0's nibbles */
    case EI_TYPE_Q5_0:
    case EI_TYPE_Q5_1: return 160;   /* nibbles as Q4, then each row's qh word */
    case EI_TYPE_Q8_0: return 256;
    default: return 0;
    }
}

/* Where a GGUF block of each packable type keeps its fields. */
typedef struct {
    size_t bytes, qs;   /* block size, offset of the quants */
    int m, qh;          /* offsets of the f16 min and the 32-bit qh word; -1: none */
} src_layout;

static src_layout layout(int type) {
    switch (type) {
    case EI_TYPE_Q4_0: return (src_layout){sizeof(block_q4_0), offsetof(block_q4_0, qs), -1, -1};
    case EI_TYPE_IQ4_NL: return (src_layout){sizeof(block_iq4_nl), offsetof(block_iq4_nl, qs), -1, -1};
    case EI_TYPE_Q4_1: return (src_layout){sizeof(block_q4_1), offsetof(block_q4_1, qs), offsetof(block_q4_1, m), -1};
    case EI_TYPE_Q5_0: return (src_layout){sizeof(block_q5_0), offsetof(block_q5_0, qs), -1, offsetof(block_q5_0, qh)};
    case EI_TYPE_Q5_1:
        return (src_layout){sizeof(block_q5_1), offsetof(block_q5_1, qs), offsetof(block_q5_1, m),
                            offsetof(block_q5_1, qh)};
    default: return (src_layout){sizeof(block_q8_0), offsetof(block_q8_0, qs), -1, -1};
    }
}

/* f16 d[8], then f16 m[8] for types with a min (the others' min is -offset * d,
 * computed in the kernel: no extra bytes to stream). */
static int header_bytes(int type) { return layout(type).m >= 0 ? 32 : 16; }

/* Elements of one packed unit (a block, or a K-quant super-block) and its bytes for 8 rows. */
static int unit_elems(int type) { return ei_packed_k_unit_bytes(type) ? QKK : QK; }
static size_t unit_bytes(int type) {
    const size_t kb = ei_packed_k_unit_bytes(type);
    return kb ? kb : (size_t)(header_bytes(type) + quant_bytes(type));
}

size_t ei_packed_bytes(const ei_kernels *k, int type, int64_t n_rows, int64_t n_cols) {
    if (type < 0 || type >= EI_TYPE_IDS || !k->packed[type].x1) return 0;
    if (n_rows % EI_PACK_ROWS || n_cols % unit_elems(type) || n_rows < EI_PACK_ROWS || n_cols <= 0) return 0;
    return (size_t)(n_rows / EI_PACK_ROWS) * (size_t)(n_cols / unit_elems(type)) * unit_bytes(type);
}

/* The groups that come in row pairs: all but a last, unpaired one where the table has 16-row
 * kernels for the type, else none. */
static int64_t paired_groups(const ei_kernels *k, int type, int64_t n_rows) {
    return k->packed[type].x1_2g ? (n_rows / EI_PACK_ROWS) & ~(int64_t)1 : 0;
}

/* Where group g's block b starts (packed.h, ei_unit_offset). */
static size_t block_offset(const ei_kernels *k, int type, int64_t n_rows, int64_t nb, int64_t g, int64_t b) {
    return ei_unit_offset(paired_groups(k, type, n_rows), nb, unit_bytes(type), g, b);
}

void ei_pack(const ei_kernels *k, int type, const void *w, int64_t n_rows, int64_t n_cols, void *dst) {
    if (ei_packed_k_unit_bytes(type)) {
        ei_pack_k(type, w, n_rows, n_cols, paired_groups(k, type, n_rows), dst);
        return;
    }
    const int64_t nb = n_cols / QK, n_groups = n_rows / EI_PACK_ROWS;
    const src_layout L = layout(type);
    const int groups = type == EI_TYPE_Q8_0 ? 8 : 4, hdr = header_bytes(type);
    const uint8_t *src = w;
    for (int64_t g = 0; g < n_groups; g++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *out = (uint8_t *)dst + block_offset(k, type, n_rows, nb, g, b);
            uint16_t *d = (uint16_t *)out, *m = d + EI_PACK_ROWS;
            uint8_t *q = out + hdr;
            for (int r = 0; r < EI_PACK_ROWS; r++) {
                const uint8_t *blk = src + ((g * EI_PACK_ROWS + r) * nb + b) * L.bytes;
                const uint8_t *qs = blk + L.qs;
                d[r] = ei_ld16(blk);   /* d leads every block */
                if (L.m >= 0) m[r] = ei_ld16(blk + L.m);
                if (L.qh >= 0) memcpy(q + 128 + 4 * r, blk + L.qh, 4);
                for (int k = 0; k < groups; k++)
                    for (int j = 0; j < 4; j++)
                        q[32 * k + 4 * r + j] = type == EI_TYPE_Q8_0 ? (uint8_t)(qs[4 * k + j] ^ 0x80) : qs[4 * k + j];
            }
        }
    }
}

void ei_unpack_row(const ei_kernels *k, int type, const void *packed, int64_t n_rows, int64_t n_cols, int64_t row,
                   void *dst) {
    if (ei_packed_k_unit_bytes(type)) {
        ei_unpack_k_row(type, packed, n_cols, row, paired_groups(k, type, n_rows), dst);
        return;
    }
    const int64_t nb = n_cols / QK, g = row / EI_PACK_ROWS;
    const int r = (int)(row % EI_PACK_ROWS);
    const src_layout L = layout(type);
    const int groups = type == EI_TYPE_Q8_0 ? 8 : 4, hdr = header_bytes(type);
    for (int64_t b = 0; b < nb; b++) {   /* ei_pack's walk, read back */
        const uint8_t *in = (const uint8_t *)packed + block_offset(k, type, n_rows, nb, g, b);
        const uint8_t *q = in + hdr;
        uint8_t *blk = (uint8_t *)dst + (size_t)b * L.bytes, *qs = blk + L.qs;
        memcpy(blk, in + 2 * r, 2);
        if (L.m >= 0) memcpy(blk + L.m, in + 16 + 2 * r, 2);
        if (L.qh >= 0) memcpy(blk + L.qh, q + 128 + 4 * r, 4);
        for (int kk = 0; kk < groups; kk++)
            for (int j = 0; j < 4; j++)
                qs[4 * kk + j] = type == EI_TYPE_Q8_0 ? (uint8_t)(q[32 * kk + 4 * r + j] ^ 0x80) : q[32 * kk + 4 * r + j];
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

#include "packed_dot.h"

#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))

/* The packed dot of one activation block (packed_dot.h) plus s, the start of its integer chain;
 * bits: the weights' width. */
#define DOT_AVX2(s, w, q, bits) _mm256_add_epi32(s, ei_dot_avx2(w, q, 8, EI_DOT_RUN(bits)))
#define DOT_VNNI(s, w, q, bits) ei_dot_vnni_from(s, w, q, 8)
#define DOT_AVX2_Q8(s, w, q, bits) _mm256_add_epi32(s, ei_dot_avx2_q8(w, q, 8))

/* A type's values are stored plus an offset: its own (Q4_0's 8, Q5_0's 16: unsigned quants), or
 * with VNNI, whose vpdpbusd takes unsigned weights, Q8_0's and IQ4_NL's 128. The latter is carried in
 * the integer chain, started at -128 times the sum of the activation block's quants (from its half
 * sums hs, ei_act_half_sums: -32 times each half's sum), so that the chain ends at the signed sum,
 * exact, as AVX2's signed path does: both give the same bits, and no float step takes the offset
 * (the AVX-512 16-token Q8_0 and IQ4_NL kernels 1.07x; one thread, 64 tokens, cache-resident, Zen
 * 4). The types' own offsets stay a float step (offset * d times the activation's a.s) on every
 * instruction set: in the chain, AVX2's 8-token Q4_0 kernel ran 0.89-0.91x, its per-token start
 * costing more than the FMA it saves (AVX-512's 16-token one 1.08x). */
#define IN_CHAIN(offset) ((offset) == 128.0f)
static inline int32_t offset_start(const int32_t *hs, float offset) {
    return ((hs[0] + hs[1]) >> 5) * (int32_t)offset;   /* exact: multiples of 32 */
}

/* IQ4_NL's 16 values + 128 (unsigned, as Q8_0's packed bytes); iq4_table256 in both 128-bit
 * lanes (the zmm kernels broadcast it to four) */
static inline __attribute__((always_inline)) T_AVX2 __m128i iq4_table128(void) {
    return _mm_xor_si128(_mm_loadu_si128((const __m128i *)ei_iq4nl_values), _mm_set1_epi8((char)0x80));
}
static inline __attribute__((always_inline)) T_AVX2 __m256i iq4_table256(void) {
    return _mm256_broadcastsi128_si256(iq4_table128());
}

/* One block's scales (dv, mv) and weights w[8] unpacked at p (PACKED_BODY's and PACKED_FAR_FN's).
 * FOUR_BIT: 0 bytes (Q8_0's, + 128), 1 nibbles, 2 nibbles indexing IQ4_NL's table (its values
 * + 128, then Q8_0's). */
#define PACKED_UNPACK(p, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, hdr, dv, mv, w)                          \
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)));                         \
    const __m256 mv = HAS_MIN ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p) + 16)))         \
                              : _mm256_mul_ps(dv, _mm256_set1_ps(-(OFFSET)));                         \
    __m256i w[8];                                                                                      \
    if (FOUR_BIT) {                                                                                    \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                                     \
        for (int k = 0; k < 4; k++) {                                                                  \
            const __m256i v = _mm256_loadu_si256((const __m256i *)((p) + hdr + 32 * k));               \
            w[k] = _mm256_and_si256(v, m4);                                                            \
            w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);                                  \
        }                                                                                              \
        if (FIVE_BIT) add_high_bits(w, (p) + hdr + 128);                                               \
        if (FOUR_BIT == 2)                                                                             \
            for (int k = 0; k < 8; k++) w[k] = _mm256_shuffle_epi8(iq4_table256(), w[k]);              \
    } else {                                                                                           \
        for (int k = 0; k < 8; k++) w[k] = _mm256_loadu_si256((const __m256i *)((p) + hdr + 32 * k));  \
    }

/* One token's float step for one block: acc += isum * (d * a.d) (+ min or offset * a.s); hs: the
 * block's two half sums in the token's activation row (offset_start). */
#define PACKED_TOKEN(DOT, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, a, hs, dv, mv, w, acc)                 \
    {                                                                                                  \
        const __m256i s0 = _mm256_set1_epi32(IN_CHAIN(OFFSET) ? offset_start(hs, OFFSET) : 0);        \
        const __m256 isum = _mm256_cvtepi32_ps(DOT(s0, w, (a)->q, FIVE_BIT ? 5 : FOUR_BIT ? 4 : 8));   \
        acc = _mm256_fmadd_ps(isum, _mm256_mul_ps(dv, _mm256_set1_ps((a)->d)), acc);                   \
        if (HAS_MIN || ((OFFSET) != 0 && !IN_CHAIN(OFFSET)))                                          \
            acc = _mm256_fmadd_ps(mv, _mm256_set1_ps((a)->s), acc);                                    \
    }

/* Rows 8g..8g+7 times NT tokens. The integer part is exact (packed_dot.h), so
 * the AVX2 and VNNI variants give identical results, and each token's float ops
 * are the same for every NT (packed_x8_ti's too). */
#define PACKED_BODY(DOT, NT, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)                                  \
    const int qb = FIVE_BIT ? 160 : FOUR_BIT ? 128 : 256, hdr = HAS_MIN ? 32 : 16;                 \
    const uint8_t *p = packed;                                                                     \
    __m256 acc[NT];                                                                                \
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();                                     \
    for (int64_t b = 0; b < nb; b++, p += hdr + qb) {                                              \
        if (NT == 1) ei_prefetch_ahead(p, hdr + qb);                                               \
        PACKED_UNPACK(p, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, hdr, dv, mv, w)                      \
        /* tokens spelled out: else GCC jams two blocks into the token loop and spills their 16    \
         * weight vectors (the 8-token Q4_0 kernel then gained nothing in the model) */            \
        _Pragma("GCC unroll 16")                                                                   \
        for (int t = 0; t < NT; t++) {                                                             \
            const uint8_t *row = (const uint8_t *)act + t * act_stride;                            \
            const ei_q8a *a = (const ei_q8a *)row + b;                                             \
            const int32_t *hs = ei_act_half_sums(row, nb) + 2 * b;                                 \
            PACKED_TOKEN(DOT, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, a, hs, dv, mv, w, acc[t])       \
        }                                                                                          \
    }                                                                                              \
    for (int t = 0; t < NT; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);

/* One token over two row groups far apart (pa, pb), block by block: PACKED_BODY's operations for
 * each group, so each result is the one-token kernel's bit for bit (ei_packed_far_fn). */
#define PACKED_FAR_FN(NAME, DOT, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)                               \
    T_AVX2 void ei_packed_##NAME##_far_avx2(const void *pa, const void *pb, int64_t nb, const void *act, \
                                            float *ya, float *yb) {                                \
        const int qb = FIVE_BIT ? 160 : FOUR_BIT ? 128 : 256, hdr = HAS_MIN ? 32 : 16;             \
        const uint8_t *p = pa, *q = pb;                                                            \
        const ei_q8a *a = act;                                                                     \
        const int32_t *hs = ei_act_half_sums(act, nb);                                             \
        __m256 acc = _mm256_setzero_ps(), accb = _mm256_setzero_ps();                              \
        for (int64_t b = 0; b < nb; b++, p += hdr + qb, q += hdr + qb, a++) {                      \
            ei_prefetch_ahead(p, hdr + qb);                                                        \
            ei_prefetch_ahead(q, hdr + qb);                                                        \
            {                                                                                      \
                PACKED_UNPACK(p, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, hdr, dv, mv, w)              \
                PACKED_TOKEN(DOT, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, a, hs + 2 * b, dv, mv, w, acc) \
            }                                                                                      \
            {                                                                                      \
                const ei_q8a *ab = a; /* opaque: GCC would keep one group's activation loads for   \
                                       * the other, in registers it then spills */                \
                __asm__("" : "+r"(ab));                                                            \
                PACKED_UNPACK(q, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, hdr, dv, mv, w)              \
                PACKED_TOKEN(DOT, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, ab, hs + 2 * b, dv, mv, w, accb) \
            }                                                                                      \
        }                                                                                          \
        _mm256_storeu_ps(ya, acc);                                                                 \
        _mm256_storeu_ps(yb, accb);                                                                \
    }

/* The 4-bit layout keeps low nibbles (elements 4k..) in w[k] and high nibbles
 * (elements 16+4k..) in w[k+4]; activations are read in the same order. */
#define PACKED_FN(NAME, TARGET, DOT, NT, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)                      \
    TARGET void ei_packed_##NAME(const void *packed, int64_t nb, const void *act, int64_t act_stride,   \
                            float *y, int64_t ldy) {                                               \
        PACKED_BODY(DOT, NT, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)                                  \
    }

/* Q5: bit e of each row's qh word (one row per 32-bit lane) becomes 16 in the
 * byte holding element e: w[k] holds elements 4k+j (qh byte k/2), w[k+4]
 * elements 16+4k+j (qh byte 2+k/2), at bits 4(k%2)+j. The fifth bits of w[k] from the
 * loaded qh words: */
static inline __attribute__((always_inline)) T_AVX2 __m256i high_bits(__m256i qh, int k) {
    const int byte = k < 4 ? (k >> 1) : 2 + ((k - 4) >> 1), shift = 4 * (k & 1);
    const __m256i ctl = _mm256_add_epi8(_mm256_set1_epi8((char)byte),
                                        _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                                         0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
    const __m256i bits = _mm256_set1_epi32((int)(0x08040201u << shift));
    const __m256i hit = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, ctl), bits), bits);
    return _mm256_and_si256(hit, _mm256_set1_epi8(16));
}

static inline T_AVX2 void add_high_bits(__m256i w[8], const uint8_t *qh_words) {
    const __m256i qh = _mm256_loadu_si256((const __m256i *)qh_words);
    for (int k = 0; k < 8; k++) w[k] = _mm256_or_si256(w[k], high_bits(qh, k));
}

/* The 8-token kernels' float sums: 8 rows a token, in memory (EI_IN_MEMORY), zeroed */
#define X8_SUMS(sums)                                   \
    float sums[8 * 8] __attribute__((aligned(32)));     \
    EI_IN_MEMORY(sums);                                 \
    ei_sums_zero(1, 8, NULL, sums)

/* One block's float step for token t of the 8-token kernels, PACKED_BODY's operations in its
 * order (the sums wait in memory); the min or offset term only where the type has one. */
static inline __attribute__((always_inline)) T_AVX2 void x8_block_sum(float *sums, int t, __m256 isum, __m256 dv,
                                                                      __m256 mv, const ei_q8a *a, int with_min) {
    __m256 r = ei_sum_get(1, NULL, sums, t);
    r = _mm256_fmadd_ps(isum, _mm256_mul_ps(dv, _mm256_set1_ps(a->d)), r);
    if (with_min) r = _mm256_fmadd_ps(mv, _mm256_set1_ps(a->s), r);
    ei_sum_put(1, NULL, sums, t, r);
}

/* AVX2 prefill, 4- and 5-bit weights, 8 tokens, tokens inner (packed_k_simd.h's kq45k_blk
 * order): each half of a block (its low or its high nibbles) is unpacked into 4 vectors that feed
 * all 8 tokens' integer sums, held in registers (int16 for 4-bit weights, a run of 8; int32 for
 * 5-bit, a run of 4 a half: packed_dot.h); the float sums wait in memory. Each token's operations
 * are PACKED_BODY's, so the results are bit for bit the same. Against PACKED_BODY's order
 * (weights held, tokens outside, spilling) 1.35-1.37x for Q4_0 and Q4_1 (AMD Zen 3,
 * cache-resident, scripts/bench_matvec.py --tokens 8). */
static inline __attribute__((always_inline)) T_AVX2 void packed_x8_ti(const void *packed, int64_t nb,
                                                                      const void *act, int64_t act_stride,
                                                                      float *y, int64_t ldy, const int five,
                                                                      const int has_min, const float offset) {
    enum { NT = 8 };
    const int hdr = has_min ? 32 : 16, qb = five ? 160 : 128;
    const uint8_t *p = packed;
    X8_SUMS(sums);
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++, p += hdr + qb) {
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        const __m256 mv = has_min ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))
                                  : _mm256_mul_ps(dv, _mm256_set1_ps(-offset));
        __m256i is[NT];   /* int16 sums (4-bit) or int32 (5-bit) */
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i w[4];
            for (int k = 0; k < 4; k++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(p + hdr + 32 * k));
                w[k] = _mm256_and_si256(h ? _mm256_srli_epi16(v, 4) : v, m4);
                if (five)
                    w[k] = _mm256_or_si256(w[k], high_bits(_mm256_loadu_si256((const __m256i *)(p + hdr + 128)),
                                                           4 * h + k));
            }
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const int8_t *q = ((const ei_q8a *)((const uint8_t *)act + t * act_stride) + b)->q + 16 * h;
                __m256i p0 = _mm256_maddubs_epi16(w[0], ei_bcast4(q));
                __m256i p1 = _mm256_maddubs_epi16(w[1], ei_bcast4(q + 4));
                p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(w[2], ei_bcast4(q + 8)));
                p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(w[3], ei_bcast4(q + 12)));
                __m256i s = _mm256_add_epi16(p0, p1);
                if (five) s = _mm256_madd_epi16(s, ones);
                is[t] = h == 0 ? s : five ? _mm256_add_epi32(is[t], s) : _mm256_add_epi16(is[t], s);
                EI_PIN(is[t]);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            x8_block_sum(sums, t, _mm256_cvtepi32_ps(five ? is[t] : _mm256_madd_epi16(is[t], ones)), dv, mv,
                         (const ei_q8a *)((const uint8_t *)act + t * act_stride) + b, has_min || offset != 0);
    }
    ei_sums_store(1, NT, NULL, sums, y, ldy);
}

/* Q8_0, AVX2, 8 tokens, tokens inner: a quarter of a block (2 of its 8 groups, as |w| and w) at
 * a time feeds all 8 tokens' int32 sums (packed_dot.h's ei_dot_q8_group); each token's float
 * operations are PACKED_BODY's (no offset term: the sums carry none), so the result is the
 * one-token kernel's bit for bit. */
T_AVX2 void ei_packed_q8_0_x8_avx2(const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y,
                                   int64_t ldy) {
    enum { NT = 8 };
    const uint8_t *p = packed;
    X8_SUMS(sums);
    for (int64_t b = 0; b < nb; b++, p += 16 + 256) {
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        __m256i is[NT];
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            __m256i w[2], aw[2];
            for (int i = 0; i < 2; i++) {
                w[i] = ei_q8_signed(_mm256_loadu_si256((const __m256i *)(p + 16 + 32 * (k + i))));
                aw[i] = _mm256_abs_epi8(w[i]);
            }
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const int8_t *q = ((const ei_q8a *)((const uint8_t *)act + t * act_stride) + b)->q + 4 * k;
                const __m256i s = _mm256_add_epi32(ei_dot_q8_group(aw[0], w[0], q), ei_dot_q8_group(aw[1], w[1], q + 4));
                is[t] = k == 0 ? s : _mm256_add_epi32(is[t], s);
                EI_PIN(is[t]);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            x8_block_sum(sums, t, _mm256_cvtepi32_ps(is[t]), dv, dv,
                         (const ei_q8a *)((const uint8_t *)act + t * act_stride) + b, 0);
    }
    ei_sums_store(1, NT, NULL, sums, y, ldy);
}

/* IQ4_NL's nibbles over 8 rows, one 32-element block, 8 tokens, tokens inner: Q8_0's order
 * (ei_packed_q8_0_x8_avx2) with each chunk's low and high nibbles (groups k and k + 4) looked up
 * as signed values, so the integer sums are the one-token kernels' (DOT_AVX2_Q8) and each token's
 * float step theirs (no offset term): 1.09-1.10x the 8-token loop of PACKED_BODY's order (see
 * kernels.c). */
static inline __attribute__((always_inline)) T_AVX2 void iq4_x8_block(const uint8_t *q, __m256 dv, const void *act,
                                                                       int64_t act_stride, int64_t blk, float *sums) {
    enum { NT = 8 };
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ei_iq4nl_values));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i is[NT];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * k));
        const __m256i w0 = _mm256_shuffle_epi8(table, _mm256_and_si256(v, m4));
        const __m256i w1 = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const int8_t *x = ((const ei_q8a *)((const uint8_t *)act + t * act_stride) + blk)->q;
            const __m256i s = _mm256_add_epi32(ei_dot_q8_group(a0, w0, x + 4 * k), ei_dot_q8_group(a1, w1, x + 16 + 4 * k));
            is[t] = k == 0 ? s : _mm256_add_epi32(is[t], s);
            EI_PIN(is[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
        x8_block_sum(sums, t, _mm256_cvtepi32_ps(is[t]), dv, dv, (const ei_q8a *)((const uint8_t *)act + t * act_stride) + blk, 0);
}

T_AVX2 void ei_packed_iq4_nl_x8_avx2(const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y,
                                    int64_t ldy) {
    const uint8_t *p = packed;
    X8_SUMS(sums);
    for (int64_t b = 0; b < nb; b++, p += 16 + 128)
        iq4_x8_block(p + 16, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), act, act_stride, b, sums);
    ei_sums_store(1, 8, NULL, sums, y, ldy);
}

/* IQ4_XS: per super-block the rows' d, per sub-block d * sc (PACKED_IQ4XS_FN's), then IQ4_NL's step */
T_AVX2 void ei_packed_iq4_xs_x8_avx2(const void *packed, int64_t nsb, const void *act, int64_t act_stride, float *y,
                                    int64_t ldy) {
    const uint8_t *p = packed;
    X8_SUMS(sums);
    for (int64_t b = 0; b < nsb; b++, p += EI_PK_IQ4XS_BYTES) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        for (int s = 0; s < 8; s++) {
            const __m256 dv = _mm256_mul_ps(
                d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16 + 8 * s)))));
            iq4_x8_block(p + EI_PK_HDR_IQ4XS + 128 * s, dv, act, act_stride, 8 * b + s, sums);
        }
    }
    ei_sums_store(1, 8, NULL, sums, y, ldy);
}

/* AVX2 prefill: 8 tokens a weight pass (Q4_0, one thread, cache-resident: 1.14x the 4-token
 * kernel's rate in PACKED_BODY's order, AMD Zen 3) */
#define PACKED_X8_TI(NAME, FIVE, HAS_MIN, OFFSET)                                                            \
    T_AVX2 void ei_packed_##NAME(const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y, \
                                 int64_t ldy) {                                                              \
        packed_x8_ti(packed, nb, act, act_stride, y, ldy, FIVE, HAS_MIN, OFFSET);                            \
    }
PACKED_X8_TI(q4_0_x8_avx2, 0, 0, 8.0f)
PACKED_X8_TI(q4_1_x8_avx2, 0, 1, 0.0f)
PACKED_X8_TI(q5_0_x8_avx2, 1, 0, 16.0f)
PACKED_X8_TI(q5_1_x8_avx2, 1, 1, 0.0f)

/* name: type, tokens per call, instruction set (then: tokens, 4-bit, 5-bit, min, offset) */
PACKED_FN(q4_0_x1_avx2, T_AVX2, DOT_AVX2, 1, 1, 0, 0, 8.0f)
PACKED_FN(q4_0_x4_avx2, T_AVX2, DOT_AVX2, 4, 1, 0, 0, 8.0f)
PACKED_FN(q4_0_x1_vnni, T_VNNI, DOT_VNNI, 1, 1, 0, 0, 8.0f)
PACKED_FN(q4_0_x4_vnni, T_VNNI, DOT_VNNI, 4, 1, 0, 0, 8.0f)
PACKED_FN(q4_1_x1_avx2, T_AVX2, DOT_AVX2, 1, 1, 0, 1, 0.0f)
PACKED_FN(q4_1_x4_avx2, T_AVX2, DOT_AVX2, 4, 1, 0, 1, 0.0f)
PACKED_FN(q4_1_x1_vnni, T_VNNI, DOT_VNNI, 1, 1, 0, 1, 0.0f)
PACKED_FN(q4_1_x4_vnni, T_VNNI, DOT_VNNI, 4, 1, 0, 1, 0.0f)
PACKED_FN(q5_0_x1_avx2, T_AVX2, DOT_AVX2, 1, 1, 1, 0, 16.0f)
PACKED_FN(q5_0_x4_avx2, T_AVX2, DOT_AVX2, 4, 1, 1, 0, 16.0f)
PACKED_FN(q5_0_x1_vnni, T_VNNI, DOT_VNNI, 1, 1, 1, 0, 16.0f)
PACKED_FN(q5_0_x4_vnni, T_VNNI, DOT_VNNI, 4, 1, 1, 0, 16.0f)
PACKED_FN(q5_1_x1_avx2, T_AVX2, DOT_AVX2, 1, 1, 1, 1, 0.0f)
PACKED_FN(q5_1_x4_avx2, T_AVX2, DOT_AVX2, 4, 1, 1, 1, 0.0f)
PACKED_FN(q5_1_x1_vnni, T_VNNI, DOT_VNNI, 1, 1, 1, 1, 0.0f)
PACKED_FN(q5_1_x4_vnni, T_VNNI, DOT_VNNI, 4, 1, 1, 1, 0.0f)
PACKED_FN(q8_0_x1_avx2, T_AVX2, DOT_AVX2_Q8, 1, 0, 0, 0, 0.0f)
PACKED_FN(q8_0_x4_avx2, T_AVX2, DOT_AVX2_Q8, 4, 0, 0, 0, 0.0f)
PACKED_FN(q8_0_x1_vnni, T_VNNI, DOT_VNNI, 1, 0, 0, 0, 128.0f)
PACKED_FN(q8_0_x4_vnni, T_VNNI, DOT_VNNI, 4, 0, 0, 0, 128.0f)
PACKED_FN(iq4_nl_x1_avx2, T_AVX2, DOT_AVX2_Q8, 1, 2, 0, 0, 0.0f)
PACKED_FN(iq4_nl_x4_avx2, T_AVX2, DOT_AVX2_Q8, 4, 2, 0, 0, 0.0f)
PACKED_FN(iq4_nl_x1_vnni, T_VNNI, DOT_VNNI, 1, 2, 0, 0, 128.0f)
PACKED_FN(iq4_nl_x4_vnni, T_VNNI, DOT_VNNI, 4, 2, 0, 0, 128.0f)
/* IQ4_XS (packed.h): per super-block the 8 rows' d, then per sub-block d * sc and IQ4_NL's
 * block step (PACKED_TOKEN: AVX2 Q8_0's signed sum, VNNI the values + 128 with the offset in the
 * chain; the 1B-shape IQ4_XS file's prefill 1.05x against a float offset step, Zen 4). Each
 * token's operations are the same for every NT and on both instruction sets. */
#define PACKED_IQ4XS_FN(NAME, NT, TARGET, DOT, OFFSET)                                                   \
    TARGET void ei_packed_##NAME(const void *packed, int64_t nsb, const void *act, int64_t act_stride,    \
                                 float *y, int64_t ldy) {                                                 \
        const uint8_t *p = packed;                                                                        \
        const __m256i m4 = _mm256_set1_epi8(0x0f);                                                        \
        __m256 acc[NT];                                                                                   \
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();                                        \
        for (int64_t b = 0; b < nsb; b++, p += EI_PK_IQ4XS_BYTES) {                                       \
            if (NT == 1) ei_prefetch_ahead(p, EI_PK_IQ4XS_BYTES);                                         \
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));                        \
            for (int s = 0; s < 8; s++) {                                                                 \
                const __m256 dv = _mm256_mul_ps(                                                          \
                    d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16 + 8 * s))))); \
                const uint8_t *q = p + EI_PK_HDR_IQ4XS + 128 * s;                                         \
                __m256i w[8];                                                                             \
                for (int k = 0; k < 4; k++) {                                                             \
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * k));                  \
                    w[k] = _mm256_shuffle_epi8(iq4_table256(), _mm256_and_si256(v, m4));                  \
                    w[k + 4] = _mm256_shuffle_epi8(iq4_table256(), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)); \
                }                                                                                         \
                _Pragma("GCC unroll 16")                                                                  \
                for (int t = 0; t < NT; t++) {                                                            \
                    const uint8_t *row = (const uint8_t *)act + t * act_stride;                           \
                    const ei_q8a *a = (const ei_q8a *)row + 8 * b + s;                                    \
                    const int32_t *hs = ei_act_half_sums(row, 8 * nsb) + 2 * (8 * b + s);                 \
                    PACKED_TOKEN(DOT, 2, 0, 0, OFFSET, a, hs, dv, dv, w, acc[t])                           \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        for (int t = 0; t < NT; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);                               \
    }
PACKED_IQ4XS_FN(iq4_xs_x1_vnni, 1, T_VNNI, DOT_VNNI, 128.0f)
PACKED_IQ4XS_FN(iq4_xs_x4_vnni, 4, T_VNNI, DOT_VNNI, 128.0f)
PACKED_IQ4XS_FN(iq4_xs_x16_vnni, 16, T_VNNI, DOT_VNNI, 128.0f)
PACKED_IQ4XS_FN(iq4_xs_x1_avx2, 1, T_AVX2, DOT_AVX2_Q8, 0.0f)
PACKED_IQ4XS_FN(iq4_xs_x4_avx2, 4, T_AVX2, DOT_AVX2_Q8, 0.0f)

/* Q3_K (packed.h) over 8 rows, NT tokens. Per activation block j (elements 32j.., half h = j / 4,
 * shift k = j % 4 of the low bits, hmask bit 4h + k) and token:
 *   acc += (sc_2j * sum_lo q a + sc_2j+1 * sum_hi q a) * (d * a_j.d)
 * with q + 4 (0..7) in the dot and each chain started at -4 * (sum of its half's quants), the
 * activation row's half sums (ei_act_half_sums, -32 * the sum) shifted by 3: exact. */
static inline __attribute__((always_inline)) T_AVX2 __m256i q3k_u(const uint8_t *p, int j, int m) {
    const int h = j >> 2, k = j & 3, bit = 4 * h + k;
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(p + EI_PK_HDR_Q3K + 256 * h + 32 * m));
    const __m256i hm = _mm256_loadu_si256((const __m256i *)(p + EI_PK_HDR_Q3K + 512 + 32 * m));
    const __m256i hb = bit >= 2 ? _mm256_srl_epi16(hm, _mm_cvtsi32_si128(bit - 2))
                                : _mm256_sll_epi16(hm, _mm_cvtsi32_si128(2 - bit));   /* the bit to 4 */
    return _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(lo, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3)),
                           _mm256_and_si256(hb, _mm256_set1_epi8(4)));
}

/* The 4 groups of one 16-element half of a block (weights <= 7) added to s: vpdpbusd, or AVX2's
 * maddubs run of 4 (|.| <= 4 * 2 * 7 * 127 in int16, exact: half_int16_avx2) and one madd. The
 * same integers. */
static inline __attribute__((always_inline)) T_VNNI __m256i half_dot_vnni(__m256i s, const __m256i *w, const int8_t *q) {
    for (int m = 0; m < 4; m++) s = _mm256_dpbusd_epi32(s, w[m], ei_bcast4(q + 4 * m));
    return s;
}
static inline __attribute__((always_inline)) T_AVX2 __m256i half_int16_avx2(const __m256i *w, const int8_t *q) {
    const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], ei_bcast4(q)), _mm256_maddubs_epi16(w[2], ei_bcast4(q + 8)));
    const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(w[1], ei_bcast4(q + 4)), _mm256_maddubs_epi16(w[3], ei_bcast4(q + 12)));
    return _mm256_add_epi16(p0, p1);
}
static inline __attribute__((always_inline)) T_AVX2 __m256i half_dot_avx2(__m256i s, const __m256i *w, const int8_t *q) {
    return _mm256_add_epi32(s, _mm256_madd_epi16(half_int16_avx2(w, q), _mm256_set1_epi16(1)));
}

#define PACKED_Q3K_FN(NAME, NT, TARGET, HALF)                                                             \
    TARGET void ei_packed_##NAME(const void *packed, int64_t nsb, const void *act, int64_t act_stride,   \
                                 float *y, int64_t ldy) {                                                \
        const uint8_t *p = packed;                                                                       \
        __m256 acc[NT];                                                                                  \
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();                                       \
        for (int64_t b = 0; b < nsb; b++, p += EI_PK_Q3K_BYTES) {                                        \
            if (NT == 1) ei_prefetch_ahead(p, EI_PK_Q3K_BYTES);                                          \
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));                      \
            for (int j = 0; j < 8; j++) {                                                                \
                const __m128i scb = _mm_loadu_si128((const __m128i *)(p + 16 + 16 * j));                \
                const __m256 sclo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scb));                       \
                const __m256 schi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(scb, 8)));    \
                __m256i w[8];                                                                            \
                for (int m = 0; m < 8; m++) w[m] = q3k_u(p, j, m);                                       \
                _Pragma("GCC unroll 16")                                                                 \
                for (int t = 0; t < NT; t++) {                                                           \
                    const uint8_t *row = (const uint8_t *)act + t * act_stride;                          \
                    const ei_q8a *a = (const ei_q8a *)row + 8 * b + j;                                   \
                    const int32_t *hs = ei_act_half_sums(row, 8 * nsb) + 2 * (8 * b + j);                \
                    const __m256i s0 = HALF(_mm256_set1_epi32(hs[0] >> 3), w, a->q);                     \
                    const __m256i s1 = HALF(_mm256_set1_epi32(hs[1] >> 3), w + 4, a->q + 16);            \
                    const __m256 isum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), schi,                    \
                                                        _mm256_mul_ps(_mm256_cvtepi32_ps(s0), sclo));    \
                    acc[t] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dv, _mm256_set1_ps(a->d)), acc[t]);     \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        for (int t = 0; t < NT; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);                              \
    }
PACKED_Q3K_FN(q3_k_x1_vnni, 1, T_VNNI, half_dot_vnni)
PACKED_Q3K_FN(q3_k_x4_vnni, 4, T_VNNI, half_dot_vnni)
PACKED_Q3K_FN(q3_k_x16_vnni, 16, T_VNNI, half_dot_vnni)
PACKED_Q3K_FN(q3_k_x1_avx2, 1, T_AVX2, half_dot_avx2)
PACKED_Q3K_FN(q3_k_x4_avx2, 4, T_AVX2, half_dot_avx2)

/* Q2_K (packed.h) over 8 rows, NT tokens. Per activation block j and token, in integers:
 *   I = sc_2j * sum_lo q a + sc_2j+1 * sum_hi q a,   M = -(m_2j * sum_lo a + m_2j+1 * sum_hi a)
 * (the halves' activation sums from the row's half sums, -32 * the sum), then
 *   acc += (d * I + dmin * M) * a_j.d
 * Both are exact (|I| < 2^18, |M| < 2^17) and every instruction set makes the same integers, so
 * the float steps (three multiplies) give the same bits everywhere. On AVX2 a half's int16 sums
 * are widened by a madd with the scale in place of ones, so the scale costs nothing; with VNNI a
 * vpmulld. Against the float form (a multiply for each scale and min, then two for d and dmin):
 * 1.17x the AVX2 8-token kernel's rate, 1.12x the AVX-512 16-token one's (64 tokens, one thread,
 * cache-resident, Zen 4; scripts/bench_matvec.py --tokens 64 --sizes small). Q3_K's scales done
 * so gained nothing there (1.00x, 1.01x): its kernels spend their time unpacking the 3-bit quants. */
static inline __attribute__((always_inline)) T_VNNI __m256i q2k_half_vnni(const __m256i *w, const int8_t *q,
                                                                         __m256i sc, __m256i sc2) {
    (void)sc2;
    return _mm256_mullo_epi32(half_dot_vnni(_mm256_setzero_si256(), w, q), sc);
}
static inline __attribute__((always_inline)) T_AVX2 __m256i q2k_half_avx2(const __m256i *w, const int8_t *q,
                                                                         __m256i sc, __m256i sc2) {
    (void)sc;   /* half_dot_avx2's int16 run widened by sc2, (sc, sc) a row, in place of ones */
    return _mm256_madd_epi16(half_int16_avx2(w, q), sc2);
}
/* int32 lanes x as (x, x) int16 pairs: a madd's second operand that multiplies a row's int16 run
 * by its scale as it widens it */
static inline __attribute__((always_inline)) T_AVX2 __m256i int16_pairs(__m256i x) {
    return _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(x, 16));
}
/* the two halves' activation sums (-sum each) as int16 pairs, for madd with (m_lo, m_hi) */
static inline int32_t q2k_sums(const int32_t *hs) {
    return (int32_t)(((uint32_t)(uint16_t)(int16_t)(hs[0] >> 5)) | ((uint32_t)(uint16_t)(int16_t)(hs[1] >> 5) << 16));
}

#define PACKED_Q2K_FN(NAME, NT, TARGET, HALF)                                                             \
    TARGET void ei_packed_##NAME(const void *packed, int64_t nsb, const void *act, int64_t act_stride,   \
                                 float *y, int64_t ldy) {                                                \
        const uint8_t *p = packed;                                                                       \
        const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi32(15);                            \
        __m256 acc[NT];                                                                                  \
        for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();                                       \
        for (int64_t b = 0; b < nsb; b++, p += EI_PK_Q2K_BYTES) {                                        \
            if (NT == 1) ei_prefetch_ahead(p, EI_PK_Q2K_BYTES);                                          \
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));                      \
            const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));               \
            for (int j = 0; j < 8; j++) {                                                                \
                const __m256i sm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 32 + 16 * j))); \
                const __m256i smh = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 40 + 16 * j))); \
                const __m256i sclo = _mm256_and_si256(sm, m15), schi = _mm256_and_si256(smh, m15);       \
                const __m256i sclo2 = int16_pairs(sclo), schi2 = int16_pairs(schi);                      \
                const __m256i mins = _mm256_or_si256(_mm256_srli_epi32(sm, 4),                           \
                                                     _mm256_slli_epi32(_mm256_srli_epi32(smh, 4), 16));  \
                const uint8_t *q = p + EI_PK_HDR_Q2K + 256 * (j >> 2);                                   \
                const __m128i sh = _mm_cvtsi32_si128(2 * (j & 3));                                       \
                __m256i w[8];                                                                            \
                for (int m = 0; m < 8; m++)                                                              \
                    w[m] = _mm256_and_si256(                                                             \
                        _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * m)), sh), m3);    \
                _Pragma("GCC unroll 16")                                                                 \
                for (int t = 0; t < NT; t++) {                                                           \
                    const uint8_t *row = (const uint8_t *)act + t * act_stride;                          \
                    const ei_q8a *a = (const ei_q8a *)row + 8 * b + j;                                   \
                    const int32_t *hs = ei_act_half_sums(row, 8 * nsb) + 2 * (8 * b + j);                \
                    const __m256i is = _mm256_add_epi32(HALF(w, a->q, sclo, sclo2), HALF(w + 4, a->q + 16, schi, schi2)); \
                    const __m256i ms = _mm256_madd_epi16(mins, _mm256_set1_epi32(q2k_sums(hs)));        \
                    const __m256 r = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(is),                         \
                                                     _mm256_mul_ps(mv, _mm256_cvtepi32_ps(ms)));         \
                    acc[t] = _mm256_fmadd_ps(r, _mm256_set1_ps(a->d), acc[t]);                           \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        for (int t = 0; t < NT; t++) _mm256_storeu_ps(y + t * ldy, acc[t]);                              \
    }
PACKED_Q2K_FN(q2_k_x1_vnni, 1, T_VNNI, q2k_half_vnni)
PACKED_Q2K_FN(q2_k_x4_vnni, 4, T_VNNI, q2k_half_vnni)
PACKED_Q2K_FN(q2_k_x16_vnni, 16, T_VNNI, q2k_half_vnni)
PACKED_Q2K_FN(q2_k_x1_avx2, 1, T_AVX2, q2k_half_avx2)
PACKED_Q2K_FN(q2_k_x4_avx2, 4, T_AVX2, q2k_half_avx2)
PACKED_Q2K_FN(q2_k_x8_avx2, 8, T_AVX2, q2k_half_avx2)

/* Q3_K, AVX2, 8 tokens, tokens inner (kq45k_blk's order): each half of a block is unpacked into 4
 * vectors that feed all 8 tokens' I (PACKED_Q2K_FN's form, with the offset: off / 2 added to both
 * int16 of a row, |.| <= 8 * 7 * 127 + 2 * 2048), the scales taken by the widening madd, so one
 * int32 a token is held; the float sums wait in memory. The conversion of the exact I (|I| < 2^21)
 * equals PACKED_Q3K_FN's fmadd of the two scaled halves, so the results are the one-token kernel's
 * bit for bit. 1.11x PACKED_Q3K_FN's loop at 8 tokens, which holds every weight vector and token
 * sum (Q2_K's the same way ran 0.96x its loop; 64 tokens, one thread, cache-resident, Zen 4 at
 * AVX2). */
T_AVX2 void ei_packed_q3_k_x8_avx2(const void *packed, int64_t nsb, const void *act, int64_t act_stride, float *y,
                                   int64_t ldy) {
    enum { NT = 8 };
    const uint8_t *p = packed;
    X8_SUMS(sums);
    for (int64_t b = 0; b < nsb; b++, p += EI_PK_Q3K_BYTES) {
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        for (int j = 0; j < 8; j++) {
            const int64_t blk = 8 * b + j;
            const __m128i scb = _mm_loadu_si128((const __m128i *)(p + 16 + 16 * j));
            const __m256i sc2[2] = {int16_pairs(_mm256_cvtepi8_epi32(scb)), int16_pairs(_mm256_cvtepi8_epi32(_mm_srli_si128(scb, 8)))};
            __m256i is[NT];
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) {
                __m256i w[4];
                for (int i = 0; i < 4; i++) w[i] = q3k_u(p, j, 4 * half + i);
#pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    const uint8_t *row = (const uint8_t *)act + t * act_stride;
                    const int16_t off2 = (int16_t)(ei_act_half_sums(row, 8 * nsb)[2 * blk + half] >> 4);
                    const __m256i s16 = _mm256_add_epi16(half_int16_avx2(w, ((const ei_q8a *)row + blk)->q + 16 * half),
                                                         _mm256_set1_epi16(off2));
                    const __m256i s = _mm256_madd_epi16(s16, sc2[half]);
                    is[t] = half == 0 ? s : _mm256_add_epi32(is[t], s);
                    EI_PIN(is[t]);
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                x8_block_sum(sums, t, _mm256_cvtepi32_ps(is[t]), dv, dv, (const ei_q8a *)((const uint8_t *)act + t * act_stride) + blk, 0);
        }
    }
    ei_sums_store(1, NT, NULL, sums, y, ldy);
}

/* one token over two row groups far apart (kernels.c says where they run) */
PACKED_FAR_FN(q4_0, DOT_AVX2, 1, 0, 0, 8.0f)
PACKED_FAR_FN(q8_0, DOT_AVX2_Q8, 0, 0, 0, 0.0f)
PACKED_FAR_FN(q4_1, DOT_AVX2, 1, 0, 1, 0.0f)
/* prefill: 16 tokens a weight pass with AVX-512's 32 registers (16 accumulators + 8 weights) */
PACKED_FN(q4_0_x16_vnni, T_VNNI, DOT_VNNI, 16, 1, 0, 0, 8.0f)
PACKED_FN(q4_1_x16_vnni, T_VNNI, DOT_VNNI, 16, 1, 0, 1, 0.0f)
PACKED_FN(q5_0_x16_vnni, T_VNNI, DOT_VNNI, 16, 1, 1, 0, 16.0f)
PACKED_FN(q5_1_x16_vnni, T_VNNI, DOT_VNNI, 16, 1, 1, 1, 0.0f)
PACKED_FN(q8_0_x16_vnni, T_VNNI, DOT_VNNI, 16, 0, 0, 0, 128.0f)
PACKED_FN(iq4_nl_x16_vnni, T_VNNI, DOT_VNNI, 16, 2, 0, 0, 128.0f)

/* AVX-512: NT tokens (16, 4 or 1) over a row pair (16 rows) in zmm registers, where
 * vpdpbusd does twice the ymm form's work at the same rate. The pair's blocks
 * alternate (packed.h): group g+1's block b lies gs after group g's; each lane runs
 * PACKED_BODY's operations in its order, so every (row, token) result equals the
 * 8-row kernels' bit for bit. */
/* add_high_bits over 16 rows: the shuffle works within 128-bit lanes, so the
 * same control serves all four. */
ZINL void zadd_high_bits(__m512i w[8], const uint8_t *qh_words, size_t gs) {
    const __m512i qh = zld2(qh_words, gs);
    const __m512i sixteen = _mm512_set1_epi8(16);
    for (int k = 0; k < 8; k++) {
        const int byte = k < 4 ? (k >> 1) : 2 + ((k - 4) >> 1), shift = 4 * (k & 1);
        const __m512i ctl = _mm512_add_epi8(_mm512_set1_epi8((char)byte),
                                            _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8,
                                                                                 12, 12, 12, 12)));
        const __m512i bits = _mm512_set1_epi32((int)(0x08040201u << shift));
        const __mmask64 hit = _mm512_cmpeq_epi8_mask(_mm512_and_si512(_mm512_shuffle_epi8(qh, ctl), bits), bits);
        w[k] = _mm512_or_si512(w[k], _mm512_maskz_mov_epi8(hit, sixteen));
    }
}

/* One block of a row pair: its scales, its min or offset term, and its 8 weight vectors. */
ZINL void zunpack(const uint8_t *p, size_t gs, int hdr, int four_bit, int five_bit, int has_min, float offset,
                  __m512 *dv, __m512 *mv, __m512i w[8]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    *dv = zh2f(p, gs);
    *mv = has_min ? zh2f(p + 16, gs) : _mm512_mul_ps(*dv, _mm512_set1_ps(-offset));
    if (four_bit) {
        for (int k = 0; k < 4; k++) {
            const __m512i v = zld2(p + hdr + 32 * k, gs);
            w[k] = _mm512_and_si512(v, m4);
            w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        if (five_bit) zadd_high_bits(w, p + hdr + 128, gs);
        if (four_bit == 2) {
            const __m512i table = _mm512_broadcast_i32x4(iq4_table128());
            for (int k = 0; k < 8; k++) w[k] = _mm512_shuffle_epi8(table, w[k]);
        }
    } else {
        for (int k = 0; k < 8; k++) w[k] = zld2(p + hdr + 32 * k, gs);
    }
}

/* s plus one token's integer sum over an unpacked block (ei_dot_vnni_from over 16 rows) */
ZINL __m512i zdot8(__m512i s, const __m512i w[8], const int8_t *q) {
    __m512i s0 = s, s1 = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[k], zbcast4(q + 4 * k));
        s1 = _mm512_dpbusd_epi32(s1, w[k + 1], zbcast4(q + 4 * k + 4));
    }
    return _mm512_add_epi32(s0, s1);
}

/* acc plus one token's sum over an unpacked block (PACKED_TOKEN's operations; hs: the block's
 * half sums) */
ZINL __m512 ztoken(const __m512i w[8], const ei_q8a *a, const int32_t *hs, __m512 dv, __m512 mv, int has_min,
                   float offset, __m512 acc) {
    const __m512i s = _mm512_set1_epi32(IN_CHAIN(offset) ? offset_start(hs, offset) : 0);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(zdot8(s, w, a->q)), _mm512_mul_ps(dv, _mm512_set1_ps(a->d)), acc);
    return has_min || (offset != 0 && !IN_CHAIN(offset)) ? _mm512_fmadd_ps(mv, _mm512_set1_ps(a->s), acc) : acc;
}

#define ZPACKED_FN(NAME, NT, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)                                          \
    T_ZMM void ei_packed_##NAME(const void *packed, int64_t nb, const void *act, int64_t act_stride,        \
                                float *y, int64_t ldy) {                                                    \
        const int qb = FIVE_BIT ? 160 : FOUR_BIT ? 128 : 256, hdr = HAS_MIN ? 32 : 16;                     \
        const size_t gs = (size_t)(hdr + qb);   /* a row pair: the groups' blocks alternate */             \
        const uint8_t *p = packed;                                                                         \
        __m512 acc[NT];                                                                                    \
        for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();                                         \
        for (int64_t b = 0; b < nb; b++, p += 2 * gs) {                                                    \
            if (NT == 1) ei_prefetch_ahead(p, 2 * (hdr + qb));                                             \
            __m512 dv, mv;                                                                                 \
            __m512i w[8];                                                                                  \
            zunpack(p, gs, hdr, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, &dv, &mv, w);                         \
            for (int t = 0; t < NT; t++) {                                                                 \
                const uint8_t *row = (const uint8_t *)act + t * act_stride;                                \
                const int32_t *hs = ei_act_half_sums(row, nb) + 2 * b;                                     \
                acc[t] = ztoken(w, (const ei_q8a *)row + b, hs, dv, mv, HAS_MIN, OFFSET, acc[t]);          \
            }                                                                                              \
        }                                                                                                  \
        for (int t = 0; t < NT; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);                                \
    }

/* One token over two row pairs far apart (pa's 16 rows into ya, pb's into yb), read side by
 * side: two read streams a thread. Each row's result is the x1r16 kernel's. No software
 * prefetch: with x1r16's beside the second stream, Q4_0's decode ran 0.92x x1r16's at 1 thread,
 * without it 1.13x (AMD Zen 4, 1B shape). */
#define ZPACKED_FAR_FN(NAME, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)                                             \
    T_ZMM void ei_packed_##NAME##_farr16_vnni(const void *pa, const void *pb, int64_t nb, const void *act,     \
                                              float *ya, float *yb) {                                          \
        const int qb = FIVE_BIT ? 160 : FOUR_BIT ? 128 : 256, hdr = HAS_MIN ? 32 : 16;                        \
        const size_t gs = (size_t)(hdr + qb);                                                                 \
        const uint8_t *p = pa, *q = pb;                                                                       \
        const ei_q8a *a = act;                                                                                \
        const int32_t *hs = ei_act_half_sums(act, nb);                                                        \
        __m512 acc = _mm512_setzero_ps(), accb = _mm512_setzero_ps();                                         \
        for (int64_t b = 0; b < nb; b++, p += 2 * gs, q += 2 * gs, a++) {                                     \
            __m512 dv, mv;                                                                                    \
            __m512i w[8];                                                                                     \
            zunpack(p, gs, hdr, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, &dv, &mv, w);                            \
            acc = ztoken(w, a, hs + 2 * b, dv, mv, HAS_MIN, OFFSET, acc);                                     \
            const ei_q8a *ab = a;   /* opaque, as in PACKED_FAR_FN */                                         \
            __asm__("" : "+r"(ab));                                                                           \
            zunpack(q, gs, hdr, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET, &dv, &mv, w);                            \
            accb = ztoken(w, ab, hs + 2 * b, dv, mv, HAS_MIN, OFFSET, accb);                                  \
        }                                                                                                     \
        _mm512_storeu_ps(ya, acc);                                                                            \
        _mm512_storeu_ps(yb, accb);                                                                           \
    }

/* name: type, tokens per call (16 rows) */
#define ZPACKED_TYPE(name, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)                      \
    ZPACKED_FN(name##_x16r16_vnni, 16, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)          \
    ZPACKED_FN(name##_x4r16_vnni, 4, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)            \
    ZPACKED_FN(name##_x1r16_vnni, 1, FOUR_BIT, FIVE_BIT, HAS_MIN, OFFSET)
ZPACKED_TYPE(q4_0, 1, 0, 0, 8.0f)
ZPACKED_TYPE(q4_1, 1, 0, 1, 0.0f)
ZPACKED_TYPE(q5_0, 1, 1, 0, 16.0f)
ZPACKED_TYPE(q5_1, 1, 1, 1, 0.0f)
ZPACKED_TYPE(q8_0, 0, 0, 0, 128.0f)
ZPACKED_TYPE(iq4_nl, 2, 0, 0, 128.0f)
ZPACKED_FAR_FN(q4_0, 1, 0, 0, 8.0f)
ZPACKED_FAR_FN(q4_1, 1, 0, 1, 0.0f)
ZPACKED_FAR_FN(q8_0, 0, 0, 0, 128.0f)
ZPACKED_FAR_FN(iq4_nl, 2, 0, 0, 128.0f)

/* Q3_K's 16 tokens over two consecutive row groups (never in row pairs): PACKED_Q3K_FN's
 * operations per lane, bit for bit. */
ZINL __m512i zq3k_u(const uint8_t *p, size_t gs, int j, int m) {
    const int h = j >> 2, k = j & 3, bit = 4 * h + k;
    const __m512i lo = zld2(p + EI_PK_HDR_Q3K + 256 * h + 32 * m, gs);
    const __m512i hm = zld2(p + EI_PK_HDR_Q3K + 512 + 32 * m, gs);
    const __m512i hb = bit >= 2 ? _mm512_srl_epi16(hm, _mm_cvtsi32_si128(bit - 2))
                                : _mm512_sll_epi16(hm, _mm_cvtsi32_si128(2 - bit));
    return _mm512_or_si512(_mm512_and_si512(_mm512_srl_epi16(lo, _mm_cvtsi32_si128(2 * k)), _mm512_set1_epi8(3)),
                           _mm512_and_si512(hb, _mm512_set1_epi8(4)));
}

T_ZMM void ei_packed_q3_k_x16r16_vnni(const void *packed, int64_t nsb, const void *act, int64_t act_stride, float *y,
                                      int64_t ldy) {
    enum { NT = 16 };
    const size_t gs = (size_t)nsb * EI_PK_Q3K_BYTES;
    const uint8_t *p = packed;
    __m512 acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++, p += EI_PK_Q3K_BYTES) {
        const __m512 dv = zh2f(p, gs);
        for (int j = 0; j < 8; j++) {
            const __m512 sclo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(zld8x2(p + 16 + 16 * j, gs)));
            const __m512 schi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(zld8x2(p + 24 + 16 * j, gs)));
            __m512i w[8];
            for (int m = 0; m < 8; m++) w[m] = zq3k_u(p, gs, j, m);
            for (int t = 0; t < NT; t++) {
                const uint8_t *row = (const uint8_t *)act + t * act_stride;
                const ei_q8a *a = (const ei_q8a *)row + 8 * b + j;
                const int32_t *hs = ei_act_half_sums(row, 8 * nsb) + 2 * (8 * b + j);
                __m512i s0 = _mm512_set1_epi32(hs[0] >> 3), s1 = _mm512_set1_epi32(hs[1] >> 3);
                for (int m = 0; m < 4; m++) {
                    s0 = _mm512_dpbusd_epi32(s0, w[m], zbcast4(a->q + 4 * m));
                    s1 = _mm512_dpbusd_epi32(s1, w[m + 4], zbcast4(a->q + 16 + 4 * m));
                }
                const __m512 isum =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), schi, _mm512_mul_ps(_mm512_cvtepi32_ps(s0), sclo));
                acc[t] = _mm512_fmadd_ps(isum, _mm512_mul_ps(dv, _mm512_set1_ps(a->d)), acc[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

/* Q2_K's 16 tokens over two consecutive row groups (never in row pairs): PACKED_Q2K_FN's
 * operations per lane, bit for bit. */
T_ZMM void ei_packed_q2_k_x16r16_vnni(const void *packed, int64_t nsb, const void *act, int64_t act_stride, float *y,
                                      int64_t ldy) {
    enum { NT = 16 };
    const size_t gs = (size_t)nsb * EI_PK_Q2K_BYTES;
    const __m512i m3 = _mm512_set1_epi8(3), m15 = _mm512_set1_epi32(15);
    const uint8_t *p = packed;
    __m512 acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++, p += EI_PK_Q2K_BYTES) {
        const __m512 dv = zh2f(p, gs), mv = zh2f(p + 16, gs);
        for (int j = 0; j < 8; j++) {
            const __m512i sm = _mm512_cvtepu8_epi32(zld8x2(p + 32 + 16 * j, gs));
            const __m512i smh = _mm512_cvtepu8_epi32(zld8x2(p + 40 + 16 * j, gs));
            const __m512i sclo = _mm512_and_si512(sm, m15), schi = _mm512_and_si512(smh, m15);
            const __m512i mins = _mm512_or_si512(_mm512_srli_epi32(sm, 4), _mm512_slli_epi32(_mm512_srli_epi32(smh, 4), 16));
            const uint8_t *q = p + EI_PK_HDR_Q2K + 256 * (j >> 2);
            const __m128i sh = _mm_cvtsi32_si128(2 * (j & 3));
            __m512i w[8];
            for (int m = 0; m < 8; m++) w[m] = _mm512_and_si512(_mm512_srl_epi16(zld2(q + 32 * m, gs), sh), m3);
            for (int t = 0; t < NT; t++) {
                const uint8_t *row = (const uint8_t *)act + t * act_stride;
                const ei_q8a *a = (const ei_q8a *)row + 8 * b + j;
                const int32_t *hs = ei_act_half_sums(row, 8 * nsb) + 2 * (8 * b + j);
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int m = 0; m < 4; m++) {
                    s0 = _mm512_dpbusd_epi32(s0, w[m], zbcast4(a->q + 4 * m));
                    s1 = _mm512_dpbusd_epi32(s1, w[m + 4], zbcast4(a->q + 16 + 4 * m));
                }
                const __m512i is = _mm512_add_epi32(_mm512_mullo_epi32(s0, sclo), _mm512_mullo_epi32(s1, schi));
                const __m512i ms = _mm512_madd_epi16(mins, _mm512_set1_epi32(q2k_sums(hs)));
                const __m512 r = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(is), _mm512_mul_ps(mv, _mm512_cvtepi32_ps(ms)));
                acc[t] = _mm512_fmadd_ps(r, _mm512_set1_ps(a->d), acc[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

/* IQ4_XS's 16 tokens over two consecutive row groups (16 rows; IQ4_XS never packs in row pairs):
 * PACKED_IQ4XS_FN's operations per lane, so every result is the 8-row kernels' bit for bit. */
T_ZMM void ei_packed_iq4_xs_x16r16_vnni(const void *packed, int64_t nsb, const void *act, int64_t act_stride,
                                        float *y, int64_t ldy) {
    enum { NT = 16 };
    const size_t gs = (size_t)nsb * EI_PK_IQ4XS_BYTES;   /* the second group's super-blocks */
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i table = _mm512_broadcast_i32x4(iq4_table128());
    const uint8_t *p = packed;
    __m512 acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++, p += EI_PK_IQ4XS_BYTES) {
        const __m512 d = zh2f(p, gs);
        for (int s = 0; s < 8; s++) {
            const __m512 dv = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(zld8x2(p + 16 + 8 * s, gs))));
            const uint8_t *q = p + EI_PK_HDR_IQ4XS + 128 * s;
            __m512i w[8];
            for (int k = 0; k < 4; k++) {
                const __m512i v = zld2(q + 32 * k, gs);
                w[k] = _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4));
                w[k + 4] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
            }
            for (int t = 0; t < NT; t++) {
                const uint8_t *row = (const uint8_t *)act + t * act_stride;
                const int32_t *hs = ei_act_half_sums(row, 8 * nsb) + 2 * (8 * b + s);
                acc[t] = ztoken(w, (const ei_q8a *)row + 8 * b + s, hs, dv, dv, 0, 128.0f, acc[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

#endif

/* One call's tokens over rows [r0, r1): two row groups a call where fn2 exists, then one. */
static void rows_pass(ei_packed_fn fn2, ei_packed_fn fn, const uint8_t *packed, size_t group_bytes, int64_t nb,
                      int64_t r0, int64_t r1, const uint8_t *act, int64_t act_stride, float *y, int64_t ldy) {
    int64_t r = r0;
    if (fn2)
        for (; r + 2 * EI_PACK_ROWS <= r1; r += 2 * EI_PACK_ROWS)
            fn2(packed + (size_t)(r / EI_PACK_ROWS) * group_bytes, nb, act, act_stride, y + r, ldy);
    for (; r < r1; r += EI_PACK_ROWS)
        fn(packed + (size_t)(r / EI_PACK_ROWS) * group_bytes, nb, act, act_stride, y + r, ldy);
}

void ei_matmul_packed(const ei_kernels *k, int type, const void *packed, int64_t n_cols, int64_t r0, int64_t r1,
                      const void *act, int64_t act_stride, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t nb = n_cols / unit_elems(type);
    const size_t gb = (size_t)nb * unit_bytes(type);
    const uint8_t *A = act, *P = packed;
    const int nw = k->packed[type].xw_tok;
    int64_t t = 0;
    if (k->packed[type].xw) {
        /* Several wide passes (a prefill): as many rows again past r1 (where a runtime thread's
         * next chunk lies) go to L2 in shares before passes 2.., so that chunk's first pass does
         * not wait on memory (1B-shape Q4_K_M pp256 1.04x, pp1024 1.01x; 3B pp256 1.01x; Zen 4).
         * Addresses, not pointers: they may run past the matrix, where a prefetch is harmless. */
        const int64_t passes = n_tok / nw;
        const size_t ahead = (size_t)((r1 - r0) / EI_PACK_ROWS) * gb;
        const size_t share = passes > 1 ? (ahead / (size_t)(passes - 1) + 63) & ~(size_t)63 : 0;
        uintptr_t next = (uintptr_t)(P + (size_t)(r1 / EI_PACK_ROWS) * gb);
        const uintptr_t next_end = next + ahead;
        for (; t + nw <= n_tok; t += nw) {
            for (const uintptr_t e = t > 0 ? next + share : next; next < e && next < next_end; next += 64)
                __builtin_prefetch((const void *)next, 0, 2);
            rows_pass(k->packed[type].xw_2g, k->packed[type].xw, P, gb, nb, r0, r1, A + t * act_stride, act_stride,
                      y + t * ldy, ldy);
        }
    }
    for (; t + 4 <= n_tok; t += 4)
        rows_pass(k->packed[type].x4_2g, k->packed[type].x4, P, gb, nb, r0, r1, A + t * act_stride, act_stride,
                  y + t * ldy, ldy);
    for (; t < n_tok; t++)
        rows_pass(k->packed[type].x1_2g, k->packed[type].x1, P, gb, nb, r0, r1, A + t * act_stride, act_stride,
                  y + t * ldy, ldy);
}

int64_t ei_matmul_packed_far(const ei_kernels *k, int type, int64_t n_cols, const void *packed_a, int64_t ra,
                             float *ya, const void *packed_b, int64_t rb, float *yb, int64_t n, const void *act) {
    const ei_packed_far_fn far = k->packed[type].x1_far;
    /* a type packed in row pairs: whole pairs only (a last, unpaired group lies past them) */
    const int64_t step = k->packed[type].x1_2g ? 2 * EI_PACK_ROWS : EI_PACK_ROWS, m = n - n % step;
    const int64_t nb = n_cols / unit_elems(type);
    const size_t gb = (size_t)nb * unit_bytes(type);
    const uint8_t *A = packed_a, *B = packed_b;
    for (int64_t r = 0; r < m; r += step)
        far(A + (size_t)((ra + r) / EI_PACK_ROWS) * gb, B + (size_t)((rb + r) / EI_PACK_ROWS) * gb, nb, act,
            ya + ra + r, yb + rb + r);
    return m;
}
