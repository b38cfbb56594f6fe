/* Row-interleaved ("packed") K-quant weights: Q2_K to Q6_K, and IQ4_XS's super-blocks
 * (layouts in packed.h). Packing unpacks each super-block's 6-bit scales and mins once, at
 * load; the kernels then run the same 8-rows-per-vector integer dots as the
 * 32-block types, one activation block (32 elements) at a time. The scalar
 * functions here are the packed kernels' oracle: they read the packed bytes and
 * do exactly the arithmetic of the unpacked scalar dots (quants_scalar.c). */
#include <stddef.h>
#include <string.h>

#include "packed.h"
#include "quants_impl.h"

size_t ei_packed_k_unit_bytes(int type) {
    switch (type) {
    case EI_TYPE_Q4_K: return EI_PK_Q4K_BYTES;
    case EI_TYPE_Q5_K: return EI_PK_Q5K_BYTES;
    case EI_TYPE_Q6_K: return EI_PK_Q6K_BYTES;
    case EI_TYPE_IQ4_XS: return EI_PK_IQ4XS_BYTES;
    case EI_TYPE_Q3_K: return EI_PK_Q3K_BYTES;
    case EI_TYPE_Q2_K: return EI_PK_Q2K_BYTES;
    default: return 0;
    }
}

/* 4-byte groups: group k of pair p holds bytes src[32p + 4k ..] of each row. */
static void put_nibble_pairs(uint8_t *q, int r, const uint8_t *src) {
    for (int p = 0; p < 4; p++)
        for (int k = 0; k < 8; k++) memcpy(q + 256 * p + 32 * k + 4 * r, src + 32 * p + 4 * k, 4);
}

static void pack_q45k(int type, const uint8_t *src, int64_t nsb, int64_t g, int64_t b, uint8_t *out) {
    const size_t bs = type == EI_TYPE_Q4_K ? sizeof(block_q4_K) : sizeof(block_q5_K);
    uint16_t *d = (uint16_t *)out, *dmin = d + 8;
    uint8_t *sc = out + 32, *mn = out + 96, *q = out + EI_PK_HDR_Q4K, *qh = out + EI_PK_Q4K_BYTES;
    for (int r = 0; r < EI_PACK_ROWS; r++) {
        const uint8_t *blk = src + ((g * EI_PACK_ROWS + r) * nsb + b) * bs;
        d[r] = ei_ld16(blk);
        dmin[r] = ei_ld16(blk + 2);
        for (int j = 0; j < 8; j++) ei_k_scale_min(j, blk + 4, &sc[8 * j + r], &mn[8 * j + r]);
        if (type == EI_TYPE_Q4_K) {
            put_nibble_pairs(q, r, blk + offsetof(block_q4_K, qs));
        } else {
            put_nibble_pairs(q, r, blk + offsetof(block_q5_K, qs));
            const uint8_t *h = blk + offsetof(block_q5_K, qh);
            /* mask of sub-block j, group k: bit 4r+i = bit j of qh[4k+i] */
            for (int j = 0; j < 8; j++)
                for (int k = 0; k < 8; k++)
                    for (int i = 0; i < 4; i++) {
                        uint8_t *m = qh + 32 * j + 4 * k + (4 * r + i) / 8;
                        const int bit = (4 * r + i) % 8;
                        *m = (uint8_t)((*m & ~(1u << bit)) | (((h[4 * k + i] >> j) & 1u) << bit));
                    }
        }
    }
}

static void pack_q6k(const uint8_t *src, int64_t nsb, int64_t g, int64_t b, uint8_t *out) {
    uint16_t *d = (uint16_t *)out;
    int8_t *sc = (int8_t *)(out + 16);
    for (int r = 0; r < EI_PACK_ROWS; r++) {
        const block_q6_K *blk = (const block_q6_K *)(src + ((g * EI_PACK_ROWS + r) * nsb + b) * sizeof(block_q6_K));
        d[r] = ei_ld16((const uint8_t *)&blk->d);
        for (int s = 0; s < 16; s++) sc[8 * s + r] = blk->scales[s];
        /* GGUF ql[32P ..] (P = 2h + c) holds blocks 4h+c (low) and 4h+c+2 (high);
         * qh[32h ..] the 2-bit tops of blocks 4h..4h+3: both copy as 4-byte groups */
        for (int k = 0; k < 8; k++) {
            for (int pr = 0; pr < 4; pr++) memcpy(out + ei_q6k_ql(pr, 32 * k + 4 * r), blk->ql + 32 * pr + 4 * k, 4);
            for (int h = 0; h < 2; h++) memcpy(out + ei_q6k_qh(h, 32 * k + 4 * r), blk->qh + 32 * h + 4 * k, 4);
        }
    }
}

static void pack_iq4xs(const uint8_t *src, int64_t nsb, int64_t g, int64_t b, uint8_t *out) {
    int8_t *sc = (int8_t *)(out + 16);
    for (int r = 0; r < EI_PACK_ROWS; r++) {
        const block_iq4_xs *blk = (const block_iq4_xs *)src + (g * EI_PACK_ROWS + r) * nsb + b;
        memcpy(out + 2 * r, &blk->d, 2);
        for (int s = 0; s < 8; s++) {
            sc[8 * s + r] = (int8_t)ei_iq4xs_scale(blk->scales_l, blk->scales_h, s);
            for (int k = 0; k < 4; k++)
                memcpy(out + EI_PK_HDR_IQ4XS + 128 * s + 32 * k + 4 * r, blk->qs + 16 * s + 4 * k, 4);
        }
    }
}

static void pack_q3k(const uint8_t *src, int64_t nsb, int64_t g, int64_t b, uint8_t *out) {
    int8_t *sc = (int8_t *)(out + 16);
    for (int r = 0; r < EI_PACK_ROWS; r++) {
        const block_q3_K *blk = (const block_q3_K *)src + (g * EI_PACK_ROWS + r) * nsb + b;
        memcpy(out + 2 * r, &blk->d, 2);
        for (int s = 0; s < 16; s++) sc[8 * s + r] = (int8_t)ei_q3k_scale(blk->scales, s);
        for (int k = 0; k < 8; k++) {
            for (int h = 0; h < 2; h++)
                memcpy(out + EI_PK_HDR_Q3K + 256 * h + 32 * k + 4 * r, blk->qs + 32 * h + 4 * k, 4);
            memcpy(out + EI_PK_HDR_Q3K + 512 + 32 * k + 4 * r, blk->hmask + 4 * k, 4);
        }
    }
}

static void pack_q2k(const uint8_t *src, int64_t nsb, int64_t g, int64_t b, uint8_t *out) {
    for (int r = 0; r < EI_PACK_ROWS; r++) {
        const block_q2_K *blk = (const block_q2_K *)src + (g * EI_PACK_ROWS + r) * nsb + b;
        memcpy(out + 2 * r, &blk->d, 2);
        memcpy(out + 16 + 2 * r, &blk->dmin, 2);
        for (int s = 0; s < 16; s++) out[32 + 8 * s + r] = blk->scales[s];
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 8; k++) memcpy(out + EI_PK_HDR_Q2K + 256 * h + 32 * k + 4 * r, blk->qs + 32 * h + 4 * k, 4);
    }
}

static void pack_unit(int type, const uint8_t *w, int64_t nsb, int64_t g, int64_t b, uint8_t *out) {
    if (type == EI_TYPE_Q6_K) pack_q6k(w, nsb, g, b, out);
    else if (type == EI_TYPE_IQ4_XS) pack_iq4xs(w, nsb, g, b, out);
    else if (type == EI_TYPE_Q3_K) pack_q3k(w, nsb, g, b, out);
    else if (type == EI_TYPE_Q2_K) pack_q2k(w, nsb, g, b, out);
    else pack_q45k(type, w, nsb, g, b, out);
}

/* Row pairs (packed.h; Q4_K only): the two groups' super-blocks interleaved chunk by chunk, a
 * chunk being one field element of 8 rows (an f16 per row: 16 bytes; a u8 scale or min per row:
 * 8; a 4-byte quant group per row: 32), so that the 16-row kernels read each field of both groups
 * with one load: the chunk at byte o of group h's 8-row super-block lies at 2 o + h c. */
static size_t pair_chunk(size_t o) { return o < 32 ? 16 : o < EI_PK_HDR_Q4K ? 8 : 32; }

static void pair_put(const uint8_t *unit, int h, uint8_t *pair) {
    for (size_t o = 0, c; o < EI_PK_Q4K_BYTES; o += c) {
        c = pair_chunk(o);
        memcpy(pair + 2 * o + h * c, unit + o, c);
    }
}

static void pair_get(const uint8_t *pair, int h, uint8_t *unit) {
    for (size_t o = 0, c; o < EI_PK_Q4K_BYTES; o += c) {
        c = pair_chunk(o);
        memcpy(unit + o, pair + 2 * o + h * c, c);
    }
}

void ei_pack_k(int type, const void *w, int64_t n_rows, int64_t n_cols, int64_t paired, void *dst) {
    const int64_t nsb = n_cols / QKK;
    const size_t ub = ei_packed_k_unit_bytes(type);
    uint8_t unit[EI_PK_Q6K_BYTES];   /* the largest */
    for (int64_t g = 0; g < n_rows / EI_PACK_ROWS; g++)
        for (int64_t b = 0; b < nsb; b++) {
            uint8_t *out = (uint8_t *)dst + ei_unit_offset(paired, nsb, ub, g < paired ? g & ~(int64_t)1 : g, b);
            uint8_t *to = g < paired ? unit : out;
            memset(to, 0, ub);   /* Q5_K's masks are or-ed in */
            pack_unit(type, w, nsb, g, b, to);
            if (g < paired) pair_put(unit, (int)(g & 1), out);
        }
}

/* The inverse of pack_q45k / pack_q6k for row r of the 8-row super-block at p: its GGUF block. */
static void unpack_q45k(int type, const uint8_t *p, int r, uint8_t *blk) {
    const uint8_t *sc = p + 32, *mn = p + 96, *q = p + EI_PK_HDR_Q4K, *qh = p + EI_PK_Q4K_BYTES;
    memcpy(blk, p + 2 * r, 2);
    memcpy(blk + 2, p + 16 + 2 * r, 2);
    uint8_t *scales = blk + 4;   /* ei_k_scale_min's 6-bit form: every bit of the 12 bytes is used */
    for (int j = 0; j < 4; j++) {
        const uint8_t s_lo = sc[8 * j + r], m_lo = mn[8 * j + r], s_hi = sc[8 * (j + 4) + r], m_hi = mn[8 * (j + 4) + r];
        scales[j] = (uint8_t)(s_lo | (s_hi >> 4) << 6);
        scales[j + 4] = (uint8_t)(m_lo | (m_hi >> 4) << 6);
        scales[j + 8] = (uint8_t)((s_hi & 15) | (m_hi & 15) << 4);
    }
    uint8_t *qs = blk + (type == EI_TYPE_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs));
    for (int pr = 0; pr < 4; pr++)
        for (int k = 0; k < 8; k++) memcpy(qs + 32 * pr + 4 * k, q + 256 * pr + 32 * k + 4 * r, 4);
    if (type == EI_TYPE_Q5_K) {
        uint8_t *h = blk + offsetof(block_q5_K, qh);
        memset(h, 0, QKK / 8);
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 8; k++)
                for (int i = 0; i < 4; i++)
                    h[4 * k + i] |= (uint8_t)(((qh[32 * j + 4 * k + (4 * r + i) / 8] >> ((4 * r + i) % 8)) & 1u) << j);
    }
}

static void unpack_q6k(const uint8_t *p, int r, uint8_t *out) {
    block_q6_K *blk = (block_q6_K *)out;
    memcpy(&blk->d, p + 2 * r, 2);
    for (int s = 0; s < 16; s++) blk->scales[s] = (int8_t)p[16 + 8 * s + r];
    for (int k = 0; k < 8; k++) {
        for (int pr = 0; pr < 4; pr++) memcpy(blk->ql + 32 * pr + 4 * k, p + ei_q6k_ql(pr, 32 * k + 4 * r), 4);
        for (int h = 0; h < 2; h++) memcpy(blk->qh + 32 * h + 4 * k, p + ei_q6k_qh(h, 32 * k + 4 * r), 4);
    }
}

static void unpack_iq4xs(const uint8_t *p, int r, uint8_t *out) {
    block_iq4_xs *blk = (block_iq4_xs *)out;
    const int8_t *sc = (const int8_t *)(p + 16);
    memcpy(&blk->d, p + 2 * r, 2);
    uint16_t h = 0;
    memset(blk->scales_l, 0, sizeof blk->scales_l);
    for (int s = 0; s < 8; s++) {
        const int ls = sc[8 * s + r] + 32;
        blk->scales_l[s / 2] |= (uint8_t)((ls & 15) << (4 * (s % 2)));
        h |= (uint16_t)((ls >> 4) << (2 * s));
        for (int k = 0; k < 4; k++) memcpy(blk->qs + 16 * s + 4 * k, p + EI_PK_HDR_IQ4XS + 128 * s + 32 * k + 4 * r, 4);
    }
    memcpy(&blk->scales_h, &h, 2);
}

static void unpack_q3k(const uint8_t *p, int r, uint8_t *out) {
    block_q3_K *blk = (block_q3_K *)out;
    const int8_t *sc = (const int8_t *)(p + 16);
    memcpy(&blk->d, p + 2 * r, 2);
    memset(blk->scales, 0, sizeof blk->scales);
    for (int s = 0; s < 16; s++) {   /* blocks.h's 6-bit packing */
        const int v = sc[8 * s + r] + 32;
        blk->scales[s % 8] |= (uint8_t)((v & 15) << (s < 8 ? 0 : 4));
        blk->scales[8 + s % 4] |= (uint8_t)((v >> 4) << (2 * (s / 4)));
    }
    for (int k = 0; k < 8; k++) {
        for (int h = 0; h < 2; h++) memcpy(blk->qs + 32 * h + 4 * k, p + EI_PK_HDR_Q3K + 256 * h + 32 * k + 4 * r, 4);
        memcpy(blk->hmask + 4 * k, p + EI_PK_HDR_Q3K + 512 + 32 * k + 4 * r, 4);
    }
}

static void unpack_q2k(const uint8_t *p, int r, uint8_t *out) {
    block_q2_K *blk = (block_q2_K *)out;
    memcpy(&blk->d, p + 2 * r, 2);
    memcpy(&blk->dmin, p + 16 + 2 * r, 2);
    for (int s = 0; s < 16; s++) blk->scales[s] = p[32 + 8 * s + r];
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 8; k++) memcpy(blk->qs + 32 * h + 4 * k, p + EI_PK_HDR_Q2K + 256 * h + 32 * k + 4 * r, 4);
}

void ei_unpack_k_row(int type, const void *packed, int64_t n_cols, int64_t row, int64_t paired, void *dst) {
    const int64_t nsb = n_cols / QKK;
    const size_t ub = ei_packed_k_unit_bytes(type), bs = (size_t)ei_row_bytes(type, QKK);
    const int64_t g = row / EI_PACK_ROWS;
    uint8_t unit[EI_PK_Q6K_BYTES];
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *p = (const uint8_t *)packed + ei_unit_offset(paired, nsb, ub, g < paired ? g & ~(int64_t)1 : g, b);
        if (g < paired) {
            pair_get(p, (int)(g & 1), unit);
            p = unit;
        }
        uint8_t *blk = (uint8_t *)dst + (size_t)b * bs;
        if (type == EI_TYPE_Q6_K) unpack_q6k(p, (int)(row % EI_PACK_ROWS), blk);
        else if (type == EI_TYPE_IQ4_XS) unpack_iq4xs(p, (int)(row % EI_PACK_ROWS), blk);
        else if (type == EI_TYPE_Q3_K) unpack_q3k(p, (int)(row % EI_PACK_ROWS), blk);
        else if (type == EI_TYPE_Q2_K) unpack_q2k(p, (int)(row % EI_PACK_ROWS), blk);
        else unpack_q45k(type, p, (int)(row % EI_PACK_ROWS), blk);
    }
}

/* ---------------- scalar references (one token) ---------------- */

/* 4-bit value of element l of sub-block j, row r, from the nibble pairs at q. */
static inline int nib(const uint8_t *q, int j, int r, int l) {
    return (q[256 * (j >> 1) + 32 * (l >> 2) + 4 * r + (l & 3)] >> (4 * (j & 1))) & 15;
}

static void ref_q45k(int five, const void *packed, int64_t nb, const void *act, float *y) {
    const uint8_t *p = packed;
    const ei_q8a *a = act;
    const size_t ub = five ? EI_PK_Q5K_BYTES : EI_PK_Q4K_BYTES;
    float acc[EI_PACK_ROWS] = {0};
    for (int64_t b = 0; b < nb; b++, p += ub) {
        const uint8_t *sc = p + 32, *mn = p + 96, *q = p + EI_PK_HDR_Q4K, *qh = p + EI_PK_Q4K_BYTES;
        for (int j = 0; j < 8; j++, a++)
            for (int r = 0; r < EI_PACK_ROWS; r++) {
                const float d = ei_h2f(ei_ld16(p + 2 * r)), dmin = ei_h2f(ei_ld16(p + 16 + 2 * r));
                int isum = 0;
                for (int l = 0; l < 32; l++) {
                    int v = nib(q, j, r, l);
                    if (five) {
                        const int bit = 4 * r + (l & 3);
                        v |= ((qh[32 * j + 4 * (l >> 2) + bit / 8] >> (bit % 8)) & 1) << 4;
                    }
                    isum += v * a->q[l];
                }
                acc[r] += ((d * (float)sc[8 * j + r]) * a->d) * (float)isum - (dmin * (float)mn[8 * j + r]) * a->s;
            }
    }
    memcpy(y, acc, sizeof acc);
}

void ei_packed_q4_k_ref(const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y, int64_t ldy) {
    (void)act_stride, (void)ldy;
    ref_q45k(0, packed, nb, act, y);
}

void ei_packed_q5_k_ref(const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y, int64_t ldy) {
    (void)act_stride, (void)ldy;
    ref_q45k(1, packed, nb, act, y);
}

void ei_packed_q6_k_ref(const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y, int64_t ldy) {
    (void)act_stride, (void)ldy;
    const uint8_t *p = packed;
    const ei_q8a *a = act;
    float acc[EI_PACK_ROWS] = {0};
    for (int64_t b = 0; b < nb; b++, p += EI_PK_Q6K_BYTES) {
        const int8_t *sc = (const int8_t *)(p + 16);
        for (int j = 0; j < 8; j++, a++) {
            /* block j = 4h + c + 2s': nibble pair 2h + c, half s'; top bits quad h, shift 2(j & 3) */
            const int h = j >> 2, c = j & 1, hi = (j >> 1) & 1;
            for (int r = 0; r < EI_PACK_ROWS; r++) {
                int lo = 0, up = 0;
                for (int l = 0; l < 32; l++) {
                    const int o = 32 * (l >> 2) + 4 * r + (l & 3);
                    const int v = ((p[ei_q6k_ql(2 * h + c, o)] >> (4 * hi)) & 15) |
                                  (((p[ei_q6k_qh(h, o)] >> (2 * (j & 3))) & 3) << 4);
                    if (l < 16) lo += (v - 32) * a->q[l];
                    else up += (v - 32) * a->q[l];
                }
                acc[r] += (ei_h2f(ei_ld16(p + 2 * r)) * a->d) * (float)(sc[8 * (2 * j) + r] * lo + sc[8 * (2 * j + 1) + r] * up);
            }
        }
    }
    memcpy(y, acc, sizeof acc);
}

/* ---------------- x86: AVX2 (maddubs + madd) and AVX-512 VNNI (vpdpbusd) ---------------- */

#if defined(__x86_64__)
#include <immintrin.h>

#include "packed_dot.h"
#include "packed_zmm.h"

#define KT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KT_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

#define KT KT_AVX2
#define KSFX avx2
#define KVNNI 0
#include "packed_k_simd.h"
#undef KT
#undef KSFX
#undef KVNNI

#define KT KT_VNNI
#define KSFX vnni
#define KVNNI 1
#include "packed_k_simd.h"
#undef KT
#undef KSFX
#undef KVNNI
#endif
