/* NEON attention over one chunk (the contract is ei_attend_chunk's; the scalar
 * kernels in attention.c are the references, native/tests/kernel_test.c compares
 * them under qemu).
 * F16 KV: per head, scores two K tiles a pass (one FMA chain per cell, attention.h), a
 * vector exp pass, then V summed in registers; the head size is a constant where
 * it is inlined (64, 128) so the accumulators stay in the 32 NEON registers.
 * Q8_0 KV: chunk_q8_ref's integer algorithm in integer NEON (vmull/vpadal for the
 * scores, vmlal for V), so only exp() differs from the scalar kernel. */
#include "attention.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "simd_math.h"

#define AI static inline __attribute__((always_inline))

/* Values 4i..4i+3 of an F16 KV row as floats. */
AI float32x4_t ld4(const uint8_t *row, int i) { return vcvt_f32_f16(vld1_f16((const float16_t *)(row + 8 * i))); }

/* Scores of one head for U K tiles (4U chains of 4 cells): cell c's score is one FMA chain over d
 * of qs[d] times value d of c (qs: the query times scale). */
AI void tiles_scores4(const float *qs, const int U, const uint8_t *const *tile, const int hd, float32x4_t *acc) {
    for (int u = 0; u < U; u++)
        for (int i = 0; i < 4; i++) acc[4 * u + i] = vmulq_n_f32(ld4(tile[u], i), qs[0]);
    for (int d = 1; d < hd; d++)
        for (int u = 0; u < U; u++)
            for (int i = 0; i < 4; i++) acc[4 * u + i] = vfmaq_n_f32(acc[4 * u + i], ld4(tile[u], 4 * d + i), qs[d]);
}

AI void chunk_neon_body(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                        int32_t c0, int32_t n, int32_t n_cells, int32_t pos, const int hd, float scale, float *scores,
                        float *part) {
    enum { U = 2 };
    const int nv = hd / 4;
    const size_t rb = (size_t)hd * 2;
    uint16_t pad[EI_KT * EI_ATTN_MAX_HD];
    for (int j = 0; j < g; j++) {
        float *sc = scores + (size_t)j * n, *pj = part + (size_t)j * EI_ATTN_PART_FLOATS(hd);
        float qs[EI_ATTN_MAX_HD];
        for (int d = 0; d < hd; d++) qs[d] = q[(size_t)j * hd + d] * scale;
        float mx = -INFINITY;
        for (int32_t b = 0, ut; b < n; b += ut * EI_KT) {
            ut = (n - b + EI_KT - 1) / EI_KT >= U ? U : 1;
            const uint8_t *tile[U];
            for (int u = 0; u < ut; u++) tile[u] = ei_kt_tile(k, c0 + b + u * EI_KT, n_cells, hd, pad);
            float32x4_t acc[4 * U];
            if (ut == U) tiles_scores4(qs, U, tile, hd, acc);
            else tiles_scores4(qs, 1, tile, hd, acc);
            float s[4 * U * 4];
            for (int i = 0; i < 4 * ut; i++) vst1q_f32(s + 4 * i, acc[i]);
            for (int32_t c = b; c < b + ut * EI_KT && c < n; c++) {
                sc[c] = ei_attn_visible(cell_pos[c], pos) ? s[c - b] : -INFINITY;
                if (sc[c] > mx) mx = sc[c];
            }
        }
        pj[0] = mx;
        pj[1] = 0.0f;
        memset(pj + 2, 0, sizeof(float) * (size_t)hd);
        if (mx == -INFINITY) continue;
        pj[1] = exp_scores4(sc, n, mx);
        float32x4_t acc[EI_ATTN_MAX_HD / 4];
        for (int i = 0; i < nv; i++) acc[i] = vdupq_n_f32(0.0f);
        for (int32_t c = 0; c < n; c++) {
            if (sc[c] == 0.0f) continue;
            const uint8_t *vr = v + (size_t)c * rb;
            for (int i = 0; i < nv; i++) acc[i] = vfmaq_n_f32(acc[i], ld4(vr, i), sc[c]);
        }
        for (int i = 0; i < nv; i++) vst1q_f32(pj + 2 + 4 * i, acc[i]);
    }
}

/* ---- Q8_0 KV ---- */

/* sum over 32 int8 pairs, exactly */
AI int32_t dot32(const int8_t *a, const int8_t *b) {
    const int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16), b0 = vld1q_s8(b), b1 = vld1q_s8(b + 16);
    int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(a0), vget_low_s8(b0)));
    s = vpadalq_s16(s, vmull_high_s8(a0, b0));
    s = vpadalq_s16(s, vmull_s8(vget_low_s8(a1), vget_low_s8(b1)));
    s = vpadalq_s16(s, vmull_high_s8(a1, b1));
    return vaddvq_s32(s);
}

void ei_attend_chunk_q8_neon(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                             int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part) {
    (void)n_cells;   /* Q8_0 K is rows */
    const int nb = hd / 32, pf = EI_ATTN_PART_FLOATS(hd);
    const int32_t n = c1 - c0;
    const size_t rb = (size_t)nb * 34;
    k += (size_t)c0 * rb;
    v += (size_t)c0 * rb;
    cell_pos += c0;
    int8_t q8[EI_ATTN_MAX_HD];
    float dq[EI_ATTN_MAX_HD / 32], dv[EI_ATTN_CHUNK];
    int32_t qsum[EI_ATTN_MAX_HD / 32];
    int16_t w[EI_ATTN_CHUNK];
    for (int j = 0; j < g; j++) {
        float *sc = scores + (size_t)j * n, *pj = part + (size_t)j * pf;
        ei_attn_quantize_q(q + (size_t)j * hd, hd, scale, q8, dq, qsum);
        float mx = -INFINITY;
        for (int32_t c = 0; c < n; c++) {
            if (!ei_attn_visible(cell_pos[c], pos)) {
                sc[c] = -INFINITY;
                continue;
            }
            const uint8_t *kr = k + (size_t)c * rb;
            float s = 0.0f;
            for (int b = 0; b < nb; b++)
                s += (dq[b] * ei_attn_q8_scale(kr, b)) * (float)dot32(q8 + 32 * b, (const int8_t *)(kr + 34 * b + 2));
            sc[c] = s;
            if (s > mx) mx = s;
        }
        pj[0] = mx;
        pj[1] = 0.0f;
        memset(pj + 2, 0, sizeof(float) * (size_t)hd);
        if (mx == -INFINITY) continue;
        pj[1] = exp_scores4(sc, n, mx);
        for (int b = 0; b < nb; b++) {
            float wmax = 0.0f;
            for (int32_t c = 0; c < n; c++) {
                dv[c] = ei_attn_q8_scale(v + (size_t)c * rb, b);
                wmax = fmaxf(wmax, sc[c] * dv[c]);
            }
            const float inv = wmax > EI_ATTN_WMIN ? EI_ATTN_WMAX / wmax : 0.0f;
            int32_t c = 0;
            for (; c + 4 <= n; c += 4)   /* round half to even, as nearbyintf */
                vst1_s16(w + c, vmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(vmulq_f32(vld1q_f32(sc + c), vld1q_f32(dv + c)), inv))));
            for (; c < n; c++) w[c] = (int16_t)nearbyintf(sc[c] * dv[c] * inv);
            int32x4_t acc[8];
            for (int i = 0; i < 8; i++) acc[i] = vdupq_n_s32(0);
            for (c = 0; c < n; c++) {
                if (!w[c]) continue;
                const int8_t *vb = (const int8_t *)(v + (size_t)c * rb + 34 * b + 2);
                const int8x16_t x0 = vld1q_s8(vb), x1 = vld1q_s8(vb + 16);
                const int16x8_t h[4] = {vmovl_s8(vget_low_s8(x0)), vmovl_high_s8(x0), vmovl_s8(vget_low_s8(x1)), vmovl_high_s8(x1)};
                for (int i = 0; i < 4; i++) {
                    acc[2 * i] = vmlal_n_s16(acc[2 * i], vget_low_s16(h[i]), w[c]);
                    acc[2 * i + 1] = vmlal_high_n_s16(acc[2 * i + 1], h[i], w[c]);
                }
            }
            const float unit = wmax / EI_ATTN_WMAX;
            for (int i = 0; i < 8; i++) vst1q_f32(pj + 2 + 32 * b + 4 * i, vmulq_n_f32(vcvtq_f32_s32(acc[i]), unit));
        }
    }
}

void ei_attend_chunk_neon(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                          int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores,
                          float *part) {
    const int32_t n = c1 - c0;
    v += (size_t)c0 * hd * 2;
    cell_pos += c0;
    switch (hd) {
    case 64: chunk_neon_body(q, g, k, v, cell_pos, c0, n, n_cells, pos, 64, scale, scores, part); break;
    case 128: chunk_neon_body(q, g, k, v, cell_pos, c0, n, n_cells, pos, 128, scale, scores, part); break;
    default: chunk_neon_body(q, g, k, v, cell_pos, c0, n, n_cells, pos, hd, scale, scores, part); break;
    }
}
#endif
