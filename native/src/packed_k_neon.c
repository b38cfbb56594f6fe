/* Packed K-quant kernels for NEON (layouts in packed.h). A 32-byte group of
 * the packed layout is two 16-byte vectors, rows 0-3 and rows 4-7, one row per
 * 32-bit lane, so a 4-byte slice of the activations (one lane of a 16-byte
 * load) advances 4 rows per instruction:
 *   neondot  vdotq_laneq_s32 (ARMv8.2 dotprod)
 *   neon     lane broadcast, vmull_s8 x2, vpaddq_s16, vpadalq_s16 (plain ASIMD)
 * Both are exact in int32 (weights 0..63 as int8), so they give identical
 * results; each token's float operations are the same for 1 and 4 tokens.
 * The kernels are written once (EI_PKN_PASS section) and instantiated twice by
 * including this file into itself. */
#if !defined(EI_PKN_PASS)
#include <string.h>

#include "packed.h"
#include "quants_impl.h"

#if defined(__aarch64__)
#include <arm_neon.h>

/* acc + per-lane dot of w's 4-byte lanes with the 4 bytes at lane L of a */
#define PKN_DOT_PLAIN(acc, w, a, L)                                                                      \
    vpadalq_s16((acc), vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(pkn_bc(a, L))),                   \
                                  vmull_high_s8((w), pkn_bc(a, L))))
#define PKN_DOT_DP(acc, w, a, L) vdotq_laneq_s32((acc), (w), (a), L)

#define pkn_bc(a, L) vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(a), L))

/* float32x4 of 4 bytes at p (unsigned or signed) */
static inline float32x4_t pkn_u8f(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(v)))));
}
static inline int32x4_t pkn_s8i(const int8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return vmovl_s16(vget_low_s16(vmovl_s8(vcreate_s8(v))));
}
static inline float32x4_t pkn_h4(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); }

/* 16 in byte b of the result when bit b of the 16-bit mask is set */
static inline uint8x16_t pkn_hbits(uint16_t m) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)m), vdup_n_u8((uint8_t)(m >> 8)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(16));
}

#define EI_PKN_PASS 1
#define PKSFX neon
#define PKATTR
#define PKDOT PKN_DOT_PLAIN
#include "packed_k_neon.c"
#undef PKSFX
#undef PKATTR
#undef PKDOT
#undef EI_PKN_PASS

#define EI_PKN_PASS 2
#define PKSFX neondot
#define PKATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#define PKDOT PKN_DOT_DP
#include "packed_k_neon.c"
#undef PKSFX
#undef PKATTR
#undef PKDOT
#undef EI_PKN_PASS
#endif /* __aarch64__ */

#else /* EI_PKN_PASS */

#define PKCAT2(a, b) a##_##b
#define PKCAT(a, b) PKCAT2(a, b)
#define PKF(name) PKCAT(name, PKSFX)

/* sum over groups k of w[k] . a-bytes 4k..4k+3, for 4 groups starting at w, a = 16 activation bytes */
#define PK_DOT4(acc, w, a)                                                                            \
    do {                                                                                              \
        acc = PKDOT(acc, (w)[0], a, 0);                                                               \
        acc = PKDOT(acc, (w)[1], a, 1);                                                               \
        acc = PKDOT(acc, (w)[2], a, 2);                                                               \
        acc = PKDOT(acc, (w)[3], a, 3);                                                               \
    } while (0)

#define PKINL static inline PKATTR __attribute__((always_inline))

PKINL void PKF(pkn_q45k_blk)(int five, int nt, int j, const uint8_t *p, float32x4_t d0, float32x4_t d1, float32x4_t m0,
                            float32x4_t m1, const void *act, int64_t act_stride, int64_t b, float32x4_t acc[][2]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const float32x4_t dsc0 = vmulq_f32(d0, pkn_u8f(p + 32 + 8 * j)), dsc1 = vmulq_f32(d1, pkn_u8f(p + 36 + 8 * j));
    const float32x4_t dmn0 = vmulq_f32(m0, pkn_u8f(p + 96 + 8 * j)), dmn1 = vmulq_f32(m1, pkn_u8f(p + 100 + 8 * j));
    const uint8_t *qp = p + EI_PK_HDR_Q4K + 256 * (j >> 1);
    int8x16_t w0[8], w1[8];   /* rows 0-3, rows 4-7 */
    for (int k = 0; k < 8; k++) {
        uint8x16_t v0 = vld1q_u8(qp + 32 * k), v1 = vld1q_u8(qp + 32 * k + 16);
        if (j & 1) {
            v0 = vshrq_n_u8(v0, 4);
            v1 = vshrq_n_u8(v1, 4);
        } else {
            v0 = vandq_u8(v0, m4);
            v1 = vandq_u8(v1, m4);
        }
        if (five) {
            uint32_t mk;
            memcpy(&mk, p + EI_PK_Q4K_BYTES + 32 * j + 4 * k, 4);
            v0 = vorrq_u8(v0, pkn_hbits((uint16_t)mk));
            v1 = vorrq_u8(v1, pkn_hbits((uint16_t)(mk >> 16)));
        }
        w0[k] = vreinterpretq_s8_u8(v0);
        w1[k] = vreinterpretq_s8_u8(v1);
    }
    for (int t = 0; t < nt; t++) {
        const ei_q8a *a = (const ei_q8a *)((const uint8_t *)act + t * act_stride) + 8 * b + j;
        const int8x16_t a0 = vld1q_s8(a->q), a1 = vld1q_s8(a->q + 16);
        int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0), u0 = vdupq_n_s32(0), u1 = vdupq_n_s32(0);
        PK_DOT4(s0, w0, a0);
        PK_DOT4(u0, w0 + 4, a1);
        PK_DOT4(s1, w1, a0);
        PK_DOT4(u1, w1 + 4, a1);
        const float32x4_t ad = vdupq_n_f32(a->d), as = vdupq_n_f32(a->s);
        acc[t][0] = vfmaq_f32(acc[t][0], vcvtq_f32_s32(vaddq_s32(s0, u0)), vmulq_f32(dsc0, ad));
        acc[t][1] = vfmaq_f32(acc[t][1], vcvtq_f32_s32(vaddq_s32(s1, u1)), vmulq_f32(dsc1, ad));
        acc[t][0] = vfmsq_f32(acc[t][0], dmn0, as);
        acc[t][1] = vfmsq_f32(acc[t][1], dmn1, as);
    }
}

/* Q4_K / Q5_K: per sub-block j and token, acc += isum * ((d * sc) * a.d) - (dmin * m) * a.s
 * (sub-blocks spelled out: every shift and offset a constant) */
PKINL void PKF(pkn_q45k)(int five, int nt, const void *packed, int64_t nb, const void *act, int64_t act_stride,
                         float *y, int64_t ldy) {
    const uint8_t *p = packed;
    const size_t ub = five ? EI_PK_Q5K_BYTES : EI_PK_Q4K_BYTES;
    float32x4_t acc[4][2];
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++, p += ub) {
        const float32x4_t d0 = pkn_h4(p), d1 = pkn_h4(p + 8), m0 = pkn_h4(p + 16), m1 = pkn_h4(p + 24);
#define PQ45(j) PKF(pkn_q45k_blk)(five, nt, j, p, d0, d1, m0, m1, act, act_stride, b, acc)
        PQ45(0); PQ45(1); PQ45(2); PQ45(3); PQ45(4); PQ45(5); PQ45(6); PQ45(7);
#undef PQ45
    }
    for (int t = 0; t < nt; t++) {
        vst1q_f32(y + t * ldy, acc[t][0]);
        vst1q_f32(y + t * ldy + 4, acc[t][1]);
    }
}

PKINL void PKF(pkn_q6k_blk)(int nt, int j, const uint8_t *p, float32x4_t d0, float32x4_t d1, const void *act,
                           int64_t act_stride, int64_t b, float32x4_t acc[][2]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m30 = vdupq_n_u8(0x30);
    const int h = j >> 2, c = j & 1, hi = (j >> 1) & 1, s2 = 2 * (j & 3);
    const int8_t *sc = (const int8_t *)(p + 16 + 16 * j);
    const int32x4_t sl0 = pkn_s8i(sc), sl1 = pkn_s8i(sc + 4), sh0 = pkn_s8i(sc + 8), sh1 = pkn_s8i(sc + 12);
    int8x16_t w0[8], w1[8];
    for (int k = 0; k < 8; k++) {
        for (int half = 0; half < 2; half++) {
            uint8x16_t l = vld1q_u8(p + ei_q6k_ql(2 * h + c, 32 * k + 16 * half));
            uint8x16_t u = vld1q_u8(p + ei_q6k_qh(h, 32 * k + 16 * half));
            l = hi ? vshrq_n_u8(l, 4) : vandq_u8(l, m4);
            u = s2 == 0 ? vshlq_n_u8(u, 4) : s2 == 2 ? vshlq_n_u8(u, 2) : s2 == 6 ? vshrq_n_u8(u, 2) : u;
            const int8x16_t wv = vreinterpretq_s8_u8(vorrq_u8(l, vandq_u8(u, m30)));
            if (half) w1[k] = wv;
            else w0[k] = wv;
        }
    }
    for (int t = 0; t < nt; t++) {
        const ei_q8a *a = (const ei_q8a *)((const uint8_t *)act + t * act_stride) + 8 * b + j;
        const int8x16_t a0 = vld1q_s8(a->q), a1 = vld1q_s8(a->q + 16);
        const int32x4_t c0 = vdupq_n_s32(32 * (int32_t)vaddlvq_s8(a0)), c1 = vdupq_n_s32(32 * (int32_t)vaddlvq_s8(a1));
        int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0), u0 = vdupq_n_s32(0), u1 = vdupq_n_s32(0);
        PK_DOT4(s0, w0, a0);
        PK_DOT4(u0, w0 + 4, a1);
        PK_DOT4(s1, w1, a0);
        PK_DOT4(u1, w1 + 4, a1);
        const int32x4_t i0 = vmlaq_s32(vmulq_s32(vsubq_s32(s0, c0), sl0), vsubq_s32(u0, c1), sh0);
        const int32x4_t i1 = vmlaq_s32(vmulq_s32(vsubq_s32(s1, c0), sl1), vsubq_s32(u1, c1), sh1);
        const float32x4_t ad = vdupq_n_f32(a->d);
        acc[t][0] = vfmaq_f32(acc[t][0], vcvtq_f32_s32(i0), vmulq_f32(d0, ad));
        acc[t][1] = vfmaq_f32(acc[t][1], vcvtq_f32_s32(i1), vmulq_f32(d1, ad));
    }
}

/* Q6_K: per block j and token, acc += (sc_lo * (I_lo - 32 A_lo) + sc_hi * (I_hi - 32 A_hi)) * (d * a.d) */
PKINL void PKF(pkn_q6k)(int nt, const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y,
                        int64_t ldy) {
    const uint8_t *p = packed;
    float32x4_t acc[4][2];
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++, p += EI_PK_Q6K_BYTES) {
        const float32x4_t d0 = pkn_h4(p), d1 = pkn_h4(p + 8);
#define PQ6(j) PKF(pkn_q6k_blk)(nt, j, p, d0, d1, act, act_stride, b, acc)
        PQ6(0); PQ6(1); PQ6(2); PQ6(3); PQ6(4); PQ6(5); PQ6(6); PQ6(7);
#undef PQ6
    }
    for (int t = 0; t < nt; t++) {
        vst1q_f32(y + t * ldy, acc[t][0]);
        vst1q_f32(y + t * ldy + 4, acc[t][1]);
    }
}

PKATTR void PKF(ei_packed_q4_k_x1)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    PKF(pkn_q45k)(0, 1, pk, nb, act, st, y, ldy);
}
PKATTR void PKF(ei_packed_q4_k_x4)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    PKF(pkn_q45k)(0, 4, pk, nb, act, st, y, ldy);
}
PKATTR void PKF(ei_packed_q5_k_x1)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    PKF(pkn_q45k)(1, 1, pk, nb, act, st, y, ldy);
}
PKATTR void PKF(ei_packed_q5_k_x4)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    PKF(pkn_q45k)(1, 4, pk, nb, act, st, y, ldy);
}
PKATTR void PKF(ei_packed_q6_k_x1)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    PKF(pkn_q6k)(1, pk, nb, act, st, y, ldy);
}
PKATTR void PKF(ei_packed_q6_k_x4)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    PKF(pkn_q6k)(4, pk, nb, act, st, y, ldy);
}

#undef PKCAT2
#undef PKCAT
#undef PKF
#undef PKINL
#endif /* EI_PKN_PASS */
