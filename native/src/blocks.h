/* GGUF quant blocks as C structs, byte for byte as GGUF stores them (ggml-common.h).
 * f16 fields are raw IEEE half bits (ei_h2f converts); multi-byte fields are little
 * endian. Every field is at most 2-byte aligned and every size is even, so rows of
 * blocks sit back to back in a tensor with no padding.
 *
 *   Q4_0 / Q4_1 (32 elements): element j < 16 is the low nibble of qs[j], element
 *     j + 16 its high nibble. Q5_0 / Q5_1 add bit j of the 32-bit qh as bit 4 of
 *     element j.  Q4_0: x = d * (q - 8)  Q5_0: x = d * (q - 16)  Q4_1/Q5_1: x = d * q + m
 *   Q8_0 (32): x = d * qs[j].
 *   Q4_K / Q5_K (256): sub-block j (32 elements) takes nibbles of qs[32*(j/2) ..]
 *     (low for even j, high for odd), a 6-bit scale/min pair j from `scales`
 *     (ei_k_scale_min), and (Q5_K) bit j of qh[l] as bit 4 of element l;
 *     x = (d * sc) * q - (dmin * m).
 *   Q6_K (256): element e = 128*h + 32*k + l (h < 2, k < 4, l < 32) has low 4 bits
 *     (ql[64*h + 32*(k&1) + l] >> 4*(k>>1)) & 15 and high 2 bits (qh[32*h + l] >> 2*k) & 3;
 *     x = (d * scales[e/16]) * (q - 32).
 *   Q2_K / Q3_K (256): element e = 128*h + 32*k + l (h < 2, k < 4, l < 32) has 2 low bits
 *     (qs[32*h + l] >> 2*k) & 3 and sub-block s = e/16 (scale per 16 elements).
 *     Q2_K: scales[s] holds a 4-bit scale (low) and min (high); x = (d * sc) * q - (dmin * m).
 *     Q3_K: bit 4*h + k of hmask[l] clear subtracts 4 (q in -4..3); 6-bit scales, low 4 bits
 *     in the nibbles of scales[s % 8] (low nibble for s < 8), high 2 bits
 *     (scales[8 + s % 4] >> 2*(s / 4)) & 3; x = (d * (sc - 32)) * q.
 *   IQ4_NL (32): element j < 16 is the low nibble of qs[j], j + 16 the high one, each an index
 *     into the non-linear table ei_iq4nl_values; x = d * values[idx].
 *   IQ4_XS (256): IQ4_NL's nibbles for 8 sub-blocks of 32 (qs[16*s ..]), each with a 6-bit
 *     scale: low 4 bits the nibble s % 2 of scales_l[s / 2], high 2 bits (scales_h >> 2*s) & 3;
 *     x = (d * (sc - 32)) * values[idx]. */
#ifndef EI_BLOCKS_H
#define EI_BLOCKS_H
#include <stdint.h>

#define QK 32    /* elements per block of the legacy quants */
#define QKK 256  /* elements per K-quant super-block */

typedef struct {
    uint16_t d;
    uint8_t qs[QK / 2];
} block_q4_0;

typedef struct {
    uint16_t d, m;
    uint8_t qs[QK / 2];
} block_q4_1;

typedef struct {
    uint16_t d;
    uint8_t qh[4];   /* a 32-bit word, bytes (not uint32_t) so the block stays 22 bytes */
    uint8_t qs[QK / 2];
} block_q5_0;

typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK / 2];
} block_q5_1;

typedef struct {
    uint16_t d;
    int8_t qs[QK];
} block_q8_0;

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];   /* 8 packed 6-bit scale/min pairs */
    uint8_t qs[QKK / 2];
} block_q4_K;

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[QKK / 8];
    uint8_t qs[QKK / 2];
} block_q5_K;

typedef struct {
    uint8_t ql[QKK / 2];
    uint8_t qh[QKK / 4];
    int8_t scales[QKK / 16];
    uint16_t d;
} block_q6_K;

typedef struct {
    uint8_t scales[QKK / 16];   /* 4-bit scale (low nibble) and min (high) per 16 elements */
    uint8_t qs[QKK / 4];
    uint16_t d, dmin;
} block_q2_K;

typedef struct {
    uint8_t hmask[QKK / 8];
    uint8_t qs[QKK / 4];
    uint8_t scales[12];   /* 16 packed 6-bit scales */
    uint16_t d;
} block_q3_K;

typedef struct {
    uint16_t d;
    uint8_t qs[QK / 2];
} block_iq4_nl;

typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QKK / 64];
    uint8_t qs[QKK / 2];
} block_iq4_xs;

/* IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl) */
static const int8_t ei_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* The sizes gguf.constants.GGML_QUANT_SIZES gives (tests/test_kernels.py checks them
 * through ei_type_block). */
_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 is 18 bytes in GGUF");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 is 20 bytes in GGUF");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 is 22 bytes in GGUF");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 is 24 bytes in GGUF");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 is 34 bytes in GGUF");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K is 144 bytes in GGUF");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K is 176 bytes in GGUF");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K is 210 bytes in GGUF");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K is 84 bytes in GGUF");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K is 110 bytes in GGUF");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl is 18 bytes in GGUF");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs is 136 bytes in GGUF");
#endif
