/* Row-interleaved ("packed") weights for integer dot products (x86; NEON for the K-quants).
 *
 * A GGUF row stores its blocks one after another, so a dot product ends in a
 * horizontal sum per row and pays per-block scalar work. Packed weights put 8
 * rows side by side: for each 32-element block, the 8 rows' scales, then their
 * quants in 4-byte groups, so one 32-bit lane holds one row. A broadcast of 4
 * activation bytes times such a vector (vpdpbusd, or maddubs + madd on plain
 * AVX2) advances all 8 rows at once, and the 8 results land in one vector that
 * is stored as is: no horizontal sums, one scale multiply for 8 rows.
 *
 * Packed block for rows 8g..8g+7, block b (all little endian):
 *   f16 d[8] | f16 m[8] (Q4_1, Q5_1 only) | quants        x = d * q + m
 * Types without a min use m = -offset * d, computed in the kernel (Q4_0: 8,
 * Q5_0: 16, Q8_0: 128), so the packed bytes equal the GGUF bytes.
 * 4-bit quants: 128 bytes, group k < 4 holds bytes qs[4k..4k+3] of each row
 *   (low nibbles: elements 4k.., high nibbles: elements 16+4k..).
 * 5-bit (Q5_0, Q5_1): the 4-bit part as above, then each row's 32-bit qh word.
 * Q8_0: 256 bytes, group k < 8 holds q[4k..4k+3] + 128 of each row (unsigned).
 *   Needs VNNI (maddubs would saturate).
 * IQ4_NL: Q4_0's bytes (its nibbles index the type's table); the kernels look the values up
 *   and run Q8_0's arithmetic on them (VNNI only).
 * K-quants (packed_k.c) pack per 256-element super-block, scales and mins
 * unpacked from their 6-bit form once, at load (u8 / i8, [sub-block][row]):
 *   Q4_K: f16 d[8] | f16 dmin[8] | u8 sc[8][8] | u8 m[8][8] | 1024 quant bytes
 *     nibble pair p < 4 (256 bytes), group k < 8 holds GGUF qs[32p + 4k ..+3]
 *     of each row: low nibbles are elements 4k.. of sub-block 2p, high of 2p+1.
 *     x = (d * sc) * q - dmin * m
 *   Q5_K: Q4_K's bytes, then 8 x 32 bytes of fifth bits: sub-block j, group k
 *     is a 32-bit mask whose bit 4r + i is bit 4 of element 4k + i of row r.
 *   Q6_K: f16 d[8] | i8 sc[16][8] | quant bytes: ql 4 x 256, qh 2 x 256. ql pair
 *     P = 2h + c as Q4_K's pairs from GGUF ql[32P ..]: low nibbles block 4h + c,
 *     high block 4h + c + 2; qh quad h, group k holds GGUF qh[32h + 4k ..+3] of
 *     each row (bits 2s..2s+1: block 4h + s). x = (d * sc) * (q - 32). The three
 *     runs of quad h (ql pairs 2h, 2h + 1, qh quad h) alternate in 64-byte pieces
 *     (ei_q6k_ql, ei_q6k_qh), the order in which the one-token kernel reads them.
 *   Q3_K: f16 d[8] | i8 sc[16][8] (the 6-bit scales minus 32) | low bits: half h < 2,
 *     group k < 8 holds GGUF qs[32h + 4k ..+3] of each row | hmask: group k holds hmask[4k ..+3]
 *     of each row. x = (d * sc) * q, q = the two low bits - 4 + 4 * the hmask bit; 912 bytes for
 *     the 880 of GGUF. Never in row pairs.
 *   Q2_K: f16 d[8] | f16 dmin[8] | u8 scale and min of each 16-element group [16][8]
 *     (GGUF's byte: the scale in the low nibble) | the two low bits as Q3_K's. x = (d * sc) * q -
 *     (dmin * m); 672 bytes, GGUF's. Never in row pairs.
 *   IQ4_XS: f16 d[8] | i8 sc[8][8] (the 6-bit scales minus 32) | sub-block s < 8:
 *     IQ4_NL's 128 bytes from GGUF qs[16s ..]. x = (d * sc) * values[idx]; 1,104 bytes for the
 *     1,088 of GGUF. Never in row pairs.
 * Row pairs (AVX-512): where the table has 16-row kernels for a type (x1_2g), each pair of
 * groups 2p, 2p+1 alternates block by block (group 2p's block b, then group 2p+1's), so the
 * 16-row kernels stream one run of bytes: reading the two groups as two runs 8 rows' blocks
 * apart streamed 20-40% slower on AMD EPYC (Zen 5, 1 thread). Q4_K's pairs interleave finer,
 * within each super-block, chunk by chunk (packed_k.c, pair_chunk): its two super-blocks side
 * by side, two runs 1,184 bytes apart, streamed 0.55x the 8-row kernel at one token (Zen 4,
 * 1 thread). A last, unpaired group keeps the 8-row layout. Rows are split among threads in
 * multiples of 16, so no 8-row kernel ever sees a paired group.
 * Rows must come in multiples of 8; the original GGUF bytes stay mapped for the scalar
 * reference and an untied embedding's lookup (a tied one reads the packed head: ei_unpack_row).
 */
#ifndef EI_PACKED_H
#define EI_PACKED_H
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#define EI_PACK_ROWS 8

/* Bytes of one packed K-quant super-block of 8 rows (and its header). */
#define EI_PK_HDR_Q4K 160
#define EI_PK_Q4K_BYTES (EI_PK_HDR_Q4K + 1024)
#define EI_PK_Q5K_BYTES (EI_PK_Q4K_BYTES + 256)
#define EI_PK_HDR_Q6K 144
#define EI_PK_Q6K_BYTES (EI_PK_HDR_Q6K + 1024 + 512)
#define EI_PK_HDR_Q3K 144
#define EI_PK_Q3K_BYTES (EI_PK_HDR_Q3K + 512 + 256)
#define EI_PK_HDR_Q2K 160
#define EI_PK_Q2K_BYTES (EI_PK_HDR_Q2K + 512)
#define EI_PK_HDR_IQ4XS 80
#define EI_PK_IQ4XS_BYTES (EI_PK_HDR_IQ4XS + 1024)

/* Offsets in a packed Q6_K super-block of byte o (< 256) of ql pair `pair` and of qh quad h:
 * quad h's three runs alternate in 64-byte pieces, so that a decode's reads ascend. The hardware
 * prefetcher follows ascending reads; the runs read side by side (ql 256 and 1,024 bytes ahead of
 * qh) kept it idle: a read loop in the kernel's order streamed 10 GB/s where the same lines in
 * ascending order streamed 28 (AMD EPYC Zen 4, one thread). A kernel load never crosses a piece. */
static inline size_t ei_q6k_ql(int pair, int o) {
    return (size_t)(EI_PK_HDR_Q6K + 768 * (pair >> 1) + 192 * (o >> 6) + 64 * (pair & 1) + (o & 63));
}
static inline size_t ei_q6k_qh(int h, int o) {
    return (size_t)(EI_PK_HDR_Q6K + 768 * h + 192 * (o >> 6) + 128 + (o & 63));
}

/* Where group g's unit b (a block, or a super-block, of `unit` bytes) starts in a matrix of
 * nb units a row whose first `paired` groups (an even number) alternate in row pairs (a Q4_K
 * pair's two super-blocks, interleaved, start at group 2p's offset). */
static inline size_t ei_unit_offset(int64_t paired, int64_t nb, size_t unit, int64_t g, int64_t b) {
    return g < paired ? (size_t)(g & ~(int64_t)1) * (size_t)nb * unit + (size_t)(2 * b + (g & 1)) * unit
                      : ((size_t)g * (size_t)nb + (size_t)b) * unit;
}

/* Bytes of the packed form of a [n_rows, n_cols] matrix of `type`, or 0 when it
 * stays in its GGUF layout: table k has no packed kernel for the type, or the
 * shape does not fit. */
size_t ei_packed_bytes(const ei_kernels *k, int type, int64_t n_rows, int64_t n_cols);

/* Writes the packed form of w into dst (ei_packed_bytes bytes) for table k's kernels. */
void ei_pack(const ei_kernels *k, int type, const void *w, int64_t n_rows, int64_t n_cols, void *dst);

/* The GGUF bytes of row `row` of a [n_rows, n_cols] matrix that ei_pack packed for table k: its
 * inverse, so that a tied embedding's lookup reads the packed output head, which stays in memory,
 * not the file pages dropped once it was packed (they would fault back in from the disk and stay
 * in the process's RSS). dst holds ei_row_bytes(type, n_cols). */
void ei_unpack_row(const ei_kernels *k, int type, const void *packed, int64_t n_rows, int64_t n_cols, int64_t row,
                   void *dst);

/* y[t * ldy + r] for rows [r0, r1) (multiples of 8; r0 of 16 for a type packed in row
 * pairs) and tokens [0, n_tok) from packed weights and ei_q8a activations. Each (row,
 * token) result is the same whatever n_tok and r0/r1 are. */
void ei_matmul_packed(const ei_kernels *k, int type, const void *packed, int64_t n_cols, int64_t r0, int64_t r1,
                      const void *act, int64_t act_stride, int64_t n_tok, float *y, int64_t ldy);

/* One token, rows [ra, ra + m) of packed_a into ya and [rb, rb + m) of packed_b into yb, the two
 * ranges read side by side with the type's x1_far kernel, which the caller has checked is there;
 * returns m: n rounded down to the far kernel's rows (8, or 16 for a type packed in row pairs),
 * the rest left to ei_matmul_packed. Both starts are multiples of 16, both matrices of the type
 * and n_cols, and each row's result is x1's. */
int64_t ei_matmul_packed_far(const ei_kernels *k, int type, int64_t n_cols, const void *packed_a, int64_t ra, float *ya,
                          const void *packed_b, int64_t rb, float *yb, int64_t n, const void *act);

/* Decode (one token a weight pass) streams each weight once from DRAM: the one-token kernels
 * ask for the lines EI_PF_DIST bytes ahead of each unit of `bytes`, so that more misses are
 * in flight than the hardware prefetcher keeps on its own. Intel Xeon, 1B shape, 2 threads:
 * 2 KiB ahead took the FFN matmuls from 18 to 24 GB/s (512 bytes gained nothing, 1 KiB half).
 * AMD EPYC (Zen 4): 2 KiB into L1 left the 3B-shape Q6_K decode at 7.6-8.0 tok/s; 6 KiB into
 * L2 (locality 2) gives 10.3-12.9 (4 KiB 9.7-10.9, 8 KiB 9.2-12.3; L1 or L2 alike), and the
 * 1B Q4_K_M file 34 -> 36-44 tok/s (separate processes, interleaved, 3-4 rounds). */
#ifndef EI_PF_DIST
#define EI_PF_DIST 6144
#endif
#ifndef EI_PF_LOCALITY
#define EI_PF_LOCALITY 2
#endif
/* The "_hw" one-token K-quant kernels (kernels.c) prefetch only rows longer than this many
 * super-blocks; on shorter rows the hardware prefetcher, following their ascending reads, reads
 * ahead better alone (at 3,072 values a row Q4_K 1.18-1.26x, Q6_K 1.05-1.20x; one thread, AMD
 * EPYC Zen 4, scripts/bench_matvec.py). On longer rows Q6_K ran 0.95x and 0.87-0.97x without the
 * software prefetch (5,120 and 8,192 values), and the 1B shape's 8,192-value ffn_down 10-17%
 * slower in the model. */
#define EI_HW_PF_MAX_NB 16
static inline void ei_prefetch_ahead(const uint8_t *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) __builtin_prefetch(p + EI_PF_DIST + o, 0, EI_PF_LOCALITY);
}

/* packed_k.c: super-block bytes of a K type (0: not one), its packing (the first `paired`
 * groups in row pairs, ei_unit_offset), and the scalar references of its packed kernels (one
 * token, 8 rows in the unpaired layout; the oracle of the SIMD ones). */
size_t ei_packed_k_unit_bytes(int type);
void ei_pack_k(int type, const void *w, int64_t n_rows, int64_t n_cols, int64_t paired, void *dst);
void ei_unpack_k_row(int type, const void *packed, int64_t n_cols, int64_t row, int64_t paired, void *dst);
void ei_packed_q4_k_ref(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q5_k_ref(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q6_k_ref(const void *, int64_t, const void *, int64_t, float *, int64_t);

/* The types whose packed kernels read each activation row's half sums (ei_act_half_sums) on some
 * instruction set, so that their act must be ei_quantize_act_rows rows made with half sums. */
static inline int ei_packed_reads_half_sums(int type) {
    return type == EI_TYPE_Q6_K || type == EI_TYPE_Q3_K || type == EI_TYPE_Q2_K || type == EI_TYPE_IQ4_XS ||
           type == EI_TYPE_Q8_0 || type == EI_TYPE_IQ4_NL;
}

#if defined(__x86_64__)
/* The kernels kernels.c puts in the tables: per type, 1 or 4 tokens a call (AVX2 also 8, the
 * K types also 8 and 16), AVX2 (maddubs + madd) or VNNI (vpdpbusd). */
#define EI_PACKED_DECL(name, sfx)                                                                           \
    void ei_packed_##name##_x1_##sfx(const void *, int64_t, const void *, int64_t, float *, int64_t);      \
    void ei_packed_##name##_x4_##sfx(const void *, int64_t, const void *, int64_t, float *, int64_t);
#define EI_PACKED_DECL8(name, sfx)                                                                          \
    EI_PACKED_DECL(name, sfx)                                                                               \
    void ei_packed_##name##_x8_##sfx(const void *, int64_t, const void *, int64_t, float *, int64_t);
EI_PACKED_DECL8(q4_0, avx2)
EI_PACKED_DECL8(q4_1, avx2)
EI_PACKED_DECL8(q5_0, avx2)
EI_PACKED_DECL8(q5_1, avx2)
EI_PACKED_DECL8(q8_0, avx2)
#define EI_PACKED_FAR_DECL(name) \
    void ei_packed_##name##_far_avx2(const void *, const void *, int64_t, const void *, float *, float *);
EI_PACKED_DECL8(iq4_nl, avx2)
EI_PACKED_DECL8(iq4_xs, avx2)
EI_PACKED_DECL8(q3_k, avx2)
EI_PACKED_DECL8(q2_k, avx2)
EI_PACKED_FAR_DECL(q4_0)
EI_PACKED_FAR_DECL(q8_0)
EI_PACKED_FAR_DECL(q4_1)
EI_PACKED_DECL(q4_0, vnni)
EI_PACKED_DECL(q4_1, vnni)
EI_PACKED_DECL(q5_0, vnni)
EI_PACKED_DECL(q5_1, vnni)
EI_PACKED_DECL(q8_0, vnni)
EI_PACKED_DECL(iq4_nl, vnni)
void ei_packed_q4_0_x16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q4_1_x16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q5_0_x16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q5_1_x16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q8_0_x16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_iq4_nl_x16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
EI_PACKED_DECL(iq4_xs, vnni)
EI_PACKED_DECL(q3_k, vnni)
EI_PACKED_DECL(q2_k, vnni)
void ei_packed_q2_k_x16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q3_k_x16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_iq4_xs_x16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
#define EI_PACKED_DECL_K(name, sfx)                                                                         \
    EI_PACKED_DECL8(name, sfx)                                                                              \
    void ei_packed_##name##_x16_##sfx(const void *, int64_t, const void *, int64_t, float *, int64_t);
EI_PACKED_DECL_K(q4_k, avx2)
EI_PACKED_DECL_K(q5_k, avx2)
EI_PACKED_DECL_K(q6_k, avx2)
EI_PACKED_DECL_K(q4_k, vnni)
EI_PACKED_DECL_K(q5_k, vnni)
EI_PACKED_DECL_K(q6_k, vnni)
/* AVX-512, 16 tokens (and, for the K-quants, one) over two row groups (16 rows) in zmm
 * registers */
void ei_packed_q4_0_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q4_1_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q5_0_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q5_1_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q8_0_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_iq4_nl_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_iq4_xs_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q3_k_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q2_k_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
#define EI_PACKED_R16_DECL(name)                                                                            \
    void ei_packed_##name##_x1r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);    \
    void ei_packed_##name##_x4r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
EI_PACKED_R16_DECL(q4_0)
EI_PACKED_R16_DECL(q4_1)
EI_PACKED_R16_DECL(q5_0)
EI_PACKED_R16_DECL(q5_1)
EI_PACKED_R16_DECL(q8_0)
EI_PACKED_R16_DECL(iq4_nl)
/* one token over two row pairs far apart (16 rows each) */
#define EI_PACKED_FAR_R16_DECL(name) \
    void ei_packed_##name##_farr16_vnni(const void *, const void *, int64_t, const void *, float *, float *);
EI_PACKED_FAR_R16_DECL(q4_0)
EI_PACKED_FAR_R16_DECL(q4_1)
EI_PACKED_FAR_R16_DECL(q8_0)
EI_PACKED_FAR_R16_DECL(iq4_nl)
void ei_packed_q4_k_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q5_k_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q6_k_x16r16_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
EI_PACKED_R16_DECL(q4_k)
/* one token, the read-ahead left to the hardware on short rows (EI_HW_PF_MAX_NB; kernels.c says
 * where they run) */
void ei_packed_q4_k_x1r16_hw_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
void ei_packed_q6_k_x1_hw_vnni(const void *, int64_t, const void *, int64_t, float *, int64_t);
#endif
#if defined(__aarch64__)
/* packed_k_neon.c: plain ASIMD and dotprod builds */
#define EI_PACKED_DECL_NEON(name, sfx)                                                                      \
    void ei_packed_##name##_x1_##sfx(const void *, int64_t, const void *, int64_t, float *, int64_t);      \
    void ei_packed_##name##_x4_##sfx(const void *, int64_t, const void *, int64_t, float *, int64_t);
EI_PACKED_DECL_NEON(q4_k, neon)
EI_PACKED_DECL_NEON(q5_k, neon)
EI_PACKED_DECL_NEON(q6_k, neon)
EI_PACKED_DECL_NEON(q4_k, neondot)
EI_PACKED_DECL_NEON(q5_k, neondot)
EI_PACKED_DECL_NEON(q6_k, neondot)
#endif
#endif
