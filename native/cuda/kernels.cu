/* CUDA kernels of the forward pass: dequantize-on-the-fly matmuls for every
 * GGUF weight type (several weights per launch, RMSNorm and SwiGLU fusable
 * into them, to cut a decode step's launches), RMSNorm, RoPE + KV store,
 * SwiGLU, embedding lookup, chunked attention over the f16 KV ring (f32
 * accumulation, GQA), argmax, top-k.
 *
 * Weights are read in their GGUF block layout (quants_impl.h describes it);
 * each lane dequantizes one unit of 32 consecutive elements of a row into
 * registers and dots it with f32 activations of up to TT tokens, so a weight
 * row is read once per TT tokens. Activations stay in f32: no rounding beyond
 * the weights' own. */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "kernels.cuh"

/* ---------------------------------------------------------------- type geometry */
int eic_type_block(int type, int *elems, int *bytes) {
    int e = 0, b = 0;
    switch (type) {
    case EI_TYPE_F32: e = 1; b = 4; break;
    case EI_TYPE_F16: e = 1; b = 2; break;
    case EI_TYPE_BF16: e = 1; b = 2; break;
    case EI_TYPE_Q4_0: e = 32; b = 18; break;
    case EI_TYPE_Q4_1: e = 32; b = 20; break;
    case EI_TYPE_Q5_0: e = 32; b = 22; break;
    case EI_TYPE_Q5_1: e = 32; b = 24; break;
    case EI_TYPE_Q8_0: e = 32; b = 34; break;
    case EI_TYPE_Q4_K: e = 256; b = 144; break;
    case EI_TYPE_Q5_K: e = 256; b = 176; break;
    case EI_TYPE_Q6_K: e = 256; b = 210; break;
    case EI_TYPE_Q2_K: e = 256; b = 84; break;
    case EI_TYPE_Q3_K: e = 256; b = 110; break;
    case EI_TYPE_IQ4_NL: e = 32; b = 18; break;
    case EI_TYPE_IQ4_XS: e = 256; b = 136; break;
    default: return 0;
    }
    if (elems) *elems = e;
    if (bytes) *bytes = b;
    return 1;
}

int eic_type_supported(int type) { return eic_type_block(type, NULL, NULL); }

int64_t eic_row_bytes(int type, int64_t n) {
    int e, b;
    if (!eic_type_block(type, &e, &b) || n <= 0 || n % e) return 0;
    return n / e * b;
}

/* ---------------------------------------------------------------- device helpers */
__device__ __forceinline__ float ld_h(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}
__device__ __forceinline__ float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* a * b + c rounded twice, as the CPU's EI_NO_CONTRACT dequantizers (and gguf.quants) do:
 * nvcc contracts a plain `a * b + c` into one FMA (--fmad=true is the default), which
 * rounds once and breaks bit-exactness of the embedding lookup against the CPU. The
 * _rn intrinsics are never contracted. */
__device__ __forceinline__ float mul_add_2r(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }
__device__ __forceinline__ float mul_sub_2r(float a, float b, float c) { return __fsub_rn(__fmul_rn(a, b), c); }
__device__ __forceinline__ void k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q3_K: 6-bit scale s (0..15) of the 12 packed bytes, minus 32 (blocks.h) */
__device__ __forceinline__ int q3k_scale(const uint8_t *sc, int s) {
    const int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4;
    return (lo | (((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4)) - 32;
}
/* IQ4_NL's 16 levels (blocks.h's ei_iq4nl_values), as bytes of two words: no table in memory */
__device__ __forceinline__ float iq4nl_value(int i) {
    const uint64_t lo = 0xf6eaddcfbfad9881ull, hi = 0x7159453526190d01ull;
    return (float)(int8_t)(((i < 8 ? lo : hi) >> (8 * (i & 7))) & 0xff);
}

/* Unit u (elements [32u, 32u + 32)) of a row, dequantized into w[32]. For the
 * float types, elements at or past n are 0 (rows of any length). */
template <int TYPE> struct Deq;

template <> struct Deq<EI_TYPE_F32> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *w) {
        const float *r = (const float *)row + 32 * u;
        const int64_t left = n - 32 * u;
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = i < left ? __ldg(r + i) : 0.0f;
    }
};
template <> struct Deq<EI_TYPE_F16> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *w) {
        const __half *r = (const __half *)row + 32 * u;
        const int64_t left = n - 32 * u;
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = i < left ? __half2float(r[i]) : 0.0f;
    }
};
template <> struct Deq<EI_TYPE_BF16> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t n, float *w) {
        const uint16_t *r = (const uint16_t *)row + 32 * u;
        const int64_t left = n - 32 * u;
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = i < left ? bf16f(r[i]) : 0.0f;
    }
};
template <> struct Deq<EI_TYPE_Q4_0> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 18 * u;
        const float d = ld_h(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = b[2 + j];
            w[j] = d * (float)((q & 15) - 8);
            w[j + 16] = d * (float)((q >> 4) - 8);
        }
    }
};
template <> struct Deq<EI_TYPE_Q4_1> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 20 * u;
        const float d = ld_h(b), m = ld_h(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = b[4 + j];
            w[j] = mul_add_2r(d, (float)(q & 15), m);
            w[j + 16] = mul_add_2r(d, (float)(q >> 4), m);
        }
    }
};
template <> struct Deq<EI_TYPE_Q5_0> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 22 * u;
        const float d = ld_h(b);
        const uint32_t qh = ld_u32(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = b[6 + j];
            /* int, not the uint32_t of qh: q - 16 is negative for half the values */
            w[j] = d * (float)((int)((q & 15) | (((qh >> j) & 1) << 4)) - 16);
            w[j + 16] = d * (float)((int)((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
        }
    }
};
template <> struct Deq<EI_TYPE_Q5_1> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 24 * u;
        const float d = ld_h(b), m = ld_h(b + 2);
        const uint32_t qh = ld_u32(b + 4);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = b[8 + j];
            w[j] = mul_add_2r(d, (float)((q & 15) | (((qh >> j) & 1) << 4)), m);
            w[j + 16] = mul_add_2r(d, (float)((q >> 4) | (((qh >> (j + 16)) & 1) << 4)), m);
        }
    }
};
template <> struct Deq<EI_TYPE_Q8_0> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 34 * u;
        const float d = ld_h(b);
#pragma unroll
        for (int j = 0; j < 32; j++) w[j] = d * (float)(int8_t)b[2 + j];
    }
};
template <> struct Deq<EI_TYPE_Q4_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 144 * (u / 8);
        const int j = (int)(u % 8);
        int sc, m;
        k_scale_min(j, b + 4, &sc, &m);
        const float d = ld_h(b) * (float)sc, dm = ld_h(b + 2) * (float)m;
        const uint8_t *qs = b + 16 + 32 * (j / 2);
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = mul_sub_2r(d, (float)((qs[l] >> shift) & 15), dm);
    }
};
template <> struct Deq<EI_TYPE_Q5_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 176 * (u / 8);
        const int j = (int)(u % 8);
        int sc, m;
        k_scale_min(j, b + 4, &sc, &m);
        const float d = ld_h(b) * (float)sc, dm = ld_h(b + 2) * (float)m;
        const uint8_t *qh = b + 16, *qs = b + 48 + 32 * (j / 2);
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int l = 0; l < 32; l++)
            w[l] = mul_sub_2r(d, (float)(((qs[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4)), dm);
    }
};
template <> struct Deq<EI_TYPE_Q6_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 210 * (u / 8);
        const int su = (int)(u % 8), h = su / 4, k = su % 4;
        const uint8_t *ql = b + 64 * h + 32 * (k & 1), *qh = b + 128 + 32 * h;
        const int8_t *scales = (const int8_t *)(b + 192);
        const float d = ld_h(b + 208);
        const float d0 = d * (float)scales[2 * su], d1 = d * (float)scales[2 * su + 1];
        const int lshift = 4 * (k >> 1), hshift = 2 * k;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int q = ((ql[l] >> lshift) & 15) | (((qh[l] >> hshift) & 3) << 4);
            w[l] = (l < 16 ? d0 : d1) * (float)(q - 32);
        }
    }
};

template <> struct Deq<EI_TYPE_Q2_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 84 * (u / 8);
        const int j = (int)(u % 8), shift = 2 * (j & 3);
        const uint8_t *qs = b + 16 + 32 * (j >> 2);
        const float d = ld_h(b + 80), dmin = ld_h(b + 82);
        const float d0 = d * (float)(b[2 * j] & 15), m0 = dmin * (float)(b[2 * j] >> 4);
        const float d1 = d * (float)(b[2 * j + 1] & 15), m1 = dmin * (float)(b[2 * j + 1] >> 4);
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = mul_sub_2r(l < 16 ? d0 : d1, (float)((qs[l] >> shift) & 3), l < 16 ? m0 : m1);
    }
};
template <> struct Deq<EI_TYPE_Q3_K> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 110 * (u / 8);
        const int j = (int)(u % 8), h = j >> 2, k = j & 3;
        const uint8_t *hm = b, *qs = b + 32 + 32 * h;
        const float d = ld_h(b + 108);
        const float d0 = d * (float)q3k_scale(b + 96, 2 * j), d1 = d * (float)q3k_scale(b + 96, 2 * j + 1);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int q = ((qs[l] >> (2 * k)) & 3) - ((hm[l] >> (4 * h + k)) & 1 ? 0 : 4);
            w[l] = (l < 16 ? d0 : d1) * (float)q;
        }
    }
};
template <> struct Deq<EI_TYPE_IQ4_NL> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 18 * u;
        const float d = ld_h(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = d * iq4nl_value(b[2 + j] & 15);
            w[j + 16] = d * iq4nl_value(b[2 + j] >> 4);
        }
    }
};
template <> struct Deq<EI_TYPE_IQ4_XS> {
    static __device__ __forceinline__ void unit(const uint8_t *row, int64_t u, int64_t, float *w) {
        const uint8_t *b = row + 136 * (u / 8);
        const int s = (int)(u % 8);
        const int sc = (((b[4 + s / 2] >> (4 * (s % 2))) & 15) | ((((b[2] | (b[3] << 8)) >> (2 * s)) & 3) << 4)) - 32;
        const float dl = ld_h(b) * (float)sc;
        const uint8_t *qs = b + 8 + 16 * s;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = dl * iq4nl_value(qs[j] & 15);
            w[j + 16] = dl * iq4nl_value(qs[j] >> 4);
        }
    }
};

/* ---------------------------------------------------------------- matmul */
enum { MM_WARPS = 4 };

/* One launch's operands. NR == 1: the rows of the n_parts weights (one type,
 * one n_cols) are concatenated along the grid's x, so Q, K and V take one
 * launch. NR == 2 (GLU): a warp computes row r of part 0 (gate) and of part 1
 * (up) from the same x loads and writes silu(g) * u to part 0's y. */
typedef struct {
    eic_mm_part part[EIC_MM_MAX_PARTS];
    int n_parts;
    int64_t row_bytes, n_cols;
    const float *x;
    int64_t ldx, n_tok;
    const float *norm;   /* NORM: the matmul reads rmsnorm(x) * norm (fused RMSNorm) */
    float eps;
    int accumulate, vec;
} mm_args;

/* w[k][i] *= nw[i] for the unit at nw (left = n_cols - its first column):
 * (w * nw) . x is the dot with x * nw at one multiply per weight, not per token. */
template <int NR>
__device__ __forceinline__ void fold_norm(float (&w)[NR][32], const float *nw, int64_t left, int vec) {
    if (vec) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 v = __ldg((const float4 *)nw + i);
#pragma unroll
            for (int k = 0; k < NR; k++) {
                w[k][4 * i] *= v.x;
                w[k][4 * i + 1] *= v.y;
                w[k][4 * i + 2] *= v.z;
                w[k][4 * i + 3] *= v.w;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const float v = i < left ? __ldg(nw + i) : 0.0f;
#pragma unroll
            for (int k = 0; k < NR; k++) w[k][i] *= v;
        }
    }
}

/* s[k] += w[k] . xt over one unit; with NORM also q += xt . xt (the RMSNorm's
 * sum of squares, from the loads the dot makes anyway). */
template <int NR, bool NORM>
__device__ __forceinline__ void dot_unit(const float (&w)[NR][32], const float *xt, int64_t left, int vec,
                                         float (&s)[NR], float &q) {
    if (vec) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 v = __ldg((const float4 *)xt + i);
#pragma unroll
            for (int k = 0; k < NR; k++)
                s[k] += w[k][4 * i] * v.x + w[k][4 * i + 1] * v.y + w[k][4 * i + 2] * v.z + w[k][4 * i + 3] * v.w;
            if (NORM) q += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; i++)
            if (i < left) {
                const float v = __ldg(xt + i);
#pragma unroll
                for (int k = 0; k < NR; k++) s[k] += w[k][i] * v;
                if (NORM) q += v * v;
            }
    }
}

/* a.part[p] for a run-time p, read with static indices: kernel parameters indexed
 * at run time are copied to local memory first. */
__device__ __forceinline__ eic_mm_part mm_part(const mm_args &a, int p) {
    eic_mm_part r = a.part[0];
#pragma unroll
    for (int i = 1; i < EIC_MM_MAX_PARTS; i++)
        if (p == i) r = a.part[i];
    return r;
}

/* One warp per output row (row r of NR weights), TT tokens per block row of
 * the grid. vec: x rows (and norm) are 16-byte aligned and whole units, so
 * float4 loads are safe. The RMSNorm scale is constant per token, so it scales
 * the finished dot. Its sum of squares is float: positive terms summed at most
 * ~40 + n_cols/1024 deep, a relative error < 1e-5 (an NMSE near 1e-12); the
 * scale itself is computed in double, as the CPU does. */
template <int TYPE, int TT, int NR, bool NORM>
__global__ void __launch_bounds__(MM_WARPS * 32) mm_kernel(const mm_args a) {
    const int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    int p = 0;   /* NR == 1: the part holding concatenated row r */
    if (NR == 1) {
#pragma unroll
        for (int i = 0; i + 1 < EIC_MM_MAX_PARTS; i++)
            if (p == i && i + 1 < a.n_parts && r >= a.part[i].n_rows) {
                r -= a.part[i].n_rows;
                p = i + 1;
            }
    }
    if (r >= mm_part(a, p).n_rows) return;
    const int64_t t0 = (int64_t)blockIdx.y * TT;
    const int nt = (int)min((int64_t)TT, a.n_tok - t0);
    const uint8_t *row[NR];
#pragma unroll
    for (int k = 0; k < NR; k++) row[k] = (const uint8_t *)mm_part(a, p + k).w + r * a.row_bytes;
    const int64_t n_units = (a.n_cols + 31) / 32;
    float acc[NR][TT], ss[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) {
        ss[t] = 0.0f;
#pragma unroll
        for (int k = 0; k < NR; k++) acc[k][t] = 0.0f;
    }
    for (int64_t u = lane; u < n_units; u += 32) {
        const int64_t left = a.n_cols - 32 * u;
        float w[NR][32];
#pragma unroll
        for (int k = 0; k < NR; k++) Deq<TYPE>::unit(row[k], u, a.n_cols, w[k]);
        if (NORM) fold_norm<NR>(w, a.norm + 32 * u, left, a.vec);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t >= nt) break;
            float s[NR], q = 0.0f;
#pragma unroll
            for (int k = 0; k < NR; k++) s[k] = 0.0f;
            dot_unit<NR, NORM>(w, a.x + (t0 + t) * a.ldx + 32 * u, left, a.vec, s, q);
#pragma unroll
            for (int k = 0; k < NR; k++) acc[k][t] += s[k];
            if (NORM) ss[t] += q;
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
#pragma unroll
        for (int k = 0; k < NR; k++) acc[k][t] = warp_sum(acc[k][t]);
        if (NORM) ss[t] = warp_sum(ss[t]);
    }
    if (lane == 0) {
        const eic_mm_part P = mm_part(a, p);
        float b[NR];
#pragma unroll
        for (int k = 0; k < NR; k++) {
            const float *bk = mm_part(a, p + k).bias;
            b[k] = bk ? bk[r] : 0.0f;
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {   /* unrolled: acc and ss stay in registers */
            if (t >= nt) break;
            const float sc = NORM ? (float)(1.0 / sqrt((double)ss[t] / (double)a.n_cols + (double)a.eps)) : 1.0f;
            float v[NR];
#pragma unroll
            for (int k = 0; k < NR; k++) v[k] = acc[k][t] * sc + b[k];
            float *o = P.y + (t0 + t) * P.ldy + r;
            if (NR == 2) *o = v[0] / (1.0f + expf(-v[0])) * v[NR - 1];   /* as swiglu_kernel */
            else *o = a.accumulate ? *o + v[0] : v[0];
        }
    }
}

/* Token tiles: 1, 2 or 4 for decode-sized batches, 8 beyond; rows: the grid's x. */
template <int TYPE, int NR, bool NORM>
static cudaError_t mm_launch(cudaStream_t s, mm_args a, int64_t n_rows) {
    const unsigned gx = (unsigned)((n_rows + MM_WARPS - 1) / MM_WARPS);
    const dim3 block(MM_WARPS * 32);
    if (a.n_tok == 1) {
        mm_kernel<TYPE, 1, NR, NORM><<<dim3(gx, 1), block, 0, s>>>(a);
    } else if (a.n_tok == 2) {
        mm_kernel<TYPE, 2, NR, NORM><<<dim3(gx, 1), block, 0, s>>>(a);
    } else if (a.n_tok <= 4) {
        mm_kernel<TYPE, 4, NR, NORM><<<dim3(gx, 1), block, 0, s>>>(a);
    } else {
        const int64_t n_tok = a.n_tok, step = 8 * 65535LL;   /* gridDim.y <= 65535 */
        for (int64_t t = 0; t < n_tok; t += step) {
            mm_args at = a;
            at.n_tok = n_tok - t < step ? n_tok - t : step;
            at.x = a.x + t * a.ldx;
            for (int k = 0; k < a.n_parts; k++) at.part[k].y = a.part[k].y + t * a.part[k].ldy;
            mm_kernel<TYPE, 8, NR, NORM><<<dim3(gx, (unsigned)((at.n_tok + 7) / 8)), block, 0, s>>>(at);
        }
    }
    return cudaGetLastError();
}

template <int TYPE>
static cudaError_t mm_dispatch(cudaStream_t s, const mm_args &a, int64_t n_rows, int glu) {
    if (glu) return a.norm ? mm_launch<TYPE, 2, true>(s, a, n_rows) : mm_launch<TYPE, 2, false>(s, a, n_rows);
    return a.norm ? mm_launch<TYPE, 1, true>(s, a, n_rows) : mm_launch<TYPE, 1, false>(s, a, n_rows);
}

/* Bytes of a weight row as the kernels read it: float rows may have any length. */
static int64_t dev_row_bytes(int type, int64_t n) {
    if (type == EI_TYPE_F32) return n * 4;
    if (type == EI_TYPE_F16 || type == EI_TYPE_BF16) return n * 2;
    return eic_row_bytes(type, n);
}

static cudaError_t mm_run(cudaStream_t s, int type, mm_args a, int64_t n_rows, int glu) {
    if (n_rows <= 0 || a.n_tok <= 0) return cudaSuccess;
    a.row_bytes = dev_row_bytes(type, a.n_cols);
    a.vec = a.n_cols % 32 == 0 && a.ldx % 4 == 0 && ((uintptr_t)a.x & 15) == 0 && ((uintptr_t)a.norm & 15) == 0;
#define EIC_MM(T) \
    case T: return mm_dispatch<T>(s, a, n_rows, glu)
    switch (type) {
        EIC_MM(EI_TYPE_F32);
        EIC_MM(EI_TYPE_F16);
        EIC_MM(EI_TYPE_BF16);
        EIC_MM(EI_TYPE_Q4_0);
        EIC_MM(EI_TYPE_Q4_1);
        EIC_MM(EI_TYPE_Q5_0);
        EIC_MM(EI_TYPE_Q5_1);
        EIC_MM(EI_TYPE_Q8_0);
        EIC_MM(EI_TYPE_Q4_K);
        EIC_MM(EI_TYPE_Q5_K);
        EIC_MM(EI_TYPE_Q6_K);
        EIC_MM(EI_TYPE_Q2_K);
        EIC_MM(EI_TYPE_Q3_K);
        EIC_MM(EI_TYPE_IQ4_NL);
        EIC_MM(EI_TYPE_IQ4_XS);
    default: return cudaErrorInvalidValue;
    }
#undef EIC_MM
}

static mm_args mm_operands(int64_t n_cols, const float *x, int64_t ldx, int64_t n_tok, const float *norm, float eps,
                           int accumulate) {
    mm_args a = {};
    a.n_cols = n_cols;
    a.x = x;
    a.ldx = ldx;
    a.n_tok = n_tok;
    a.norm = norm;
    a.eps = eps;
    a.accumulate = accumulate;
    return a;
}

cudaError_t eic_matmul(cudaStream_t s, int type, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
                       int64_t ldx, int64_t n_tok, const float *bias, int accumulate, float *y, int64_t ldy) {
    const eic_mm_part p = {w, bias, y, n_rows, ldy};
    return eic_matmul_multi(s, type, &p, 1, n_cols, x, ldx, n_tok, NULL, 0.0f, accumulate);
}

cudaError_t eic_matmul_multi(cudaStream_t s, int type, const eic_mm_part *parts, int n_parts, int64_t n_cols,
                             const float *x, int64_t ldx, int64_t n_tok, const float *norm, float eps, int accumulate) {
    if (n_parts < 1 || n_parts > EIC_MM_MAX_PARTS) return cudaErrorInvalidValue;
    mm_args a = mm_operands(n_cols, x, ldx, n_tok, norm, eps, accumulate);
    int64_t n_rows = 0;
    for (int k = 0; k < n_parts; k++) {
        if (parts[k].n_rows < 0) return cudaErrorInvalidValue;
        a.part[k] = parts[k];
        n_rows += parts[k].n_rows;
    }
    a.n_parts = n_parts;
    return mm_run(s, type, a, n_rows, 0);
}

cudaError_t eic_matmul_glu(cudaStream_t s, int type, const void *w_gate, const float *b_gate, const void *w_up,
                           const float *b_up, int64_t n_rows, int64_t n_cols, const float *x, int64_t ldx,
                           int64_t n_tok, const float *norm, float eps, float *y, int64_t ldy) {
    mm_args a = mm_operands(n_cols, x, ldx, n_tok, norm, eps, 0);
    const eic_mm_part g = {w_gate, b_gate, y, n_rows, ldy}, u = {w_up, b_up, y, n_rows, ldy};   /* u.y unused */
    a.part[0] = g;
    a.part[1] = u;
    a.n_parts = 2;
    return mm_run(s, type, a, n_rows, 1);
}

/* ---------------------------------------------------------------- embedding */
template <int TYPE>
__global__ void embed_kernel(const uint8_t *__restrict__ table, int64_t row_bytes, int64_t ne0,
                             const int32_t *__restrict__ tokens, float *__restrict__ out) {
    const int64_t t = blockIdx.y;
    const uint8_t *row = table + (int64_t)tokens[t] * row_bytes;
    const int64_t n_units = (ne0 + 31) / 32;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n_units; u += (int64_t)gridDim.x * blockDim.x) {
        float w[32];
        Deq<TYPE>::unit(row, u, ne0, w);
        float *o = out + t * ne0 + 32 * u;
        const int64_t left = ne0 - 32 * u;
#pragma unroll
        for (int i = 0; i < 32; i++)
            if (i < left) o[i] = w[i];
    }
}

template <int TYPE>
static cudaError_t embed_launch(cudaStream_t s, const void *table, int64_t ne0, const int32_t *tokens, int64_t n_tok,
                                float *out) {
    const int64_t row_bytes = dev_row_bytes(TYPE, ne0);
    const int64_t n_units = (ne0 + 31) / 32;
    const unsigned gx = (unsigned)((n_units + 127) / 128);
    for (int64_t t = 0; t < n_tok; t += 65535) {
        const int64_t nt = n_tok - t < 65535 ? n_tok - t : 65535;
        embed_kernel<TYPE><<<dim3(gx, (unsigned)nt), 128, 0, s>>>((const uint8_t *)table, row_bytes, ne0,
                                                                  tokens + t, out + t * ne0);
    }
    return cudaGetLastError();
}

cudaError_t eic_embed(cudaStream_t s, int type, const void *table, int64_t ne0, const int32_t *tokens,
                      int64_t n_tok, float *out) {
    if (n_tok <= 0) return cudaSuccess;
#define EIC_EM(T) \
    case T: return embed_launch<T>(s, table, ne0, tokens, n_tok, out)
    switch (type) {
        EIC_EM(EI_TYPE_F32);
        EIC_EM(EI_TYPE_F16);
        EIC_EM(EI_TYPE_BF16);
        EIC_EM(EI_TYPE_Q4_0);
        EIC_EM(EI_TYPE_Q4_1);
        EIC_EM(EI_TYPE_Q5_0);
        EIC_EM(EI_TYPE_Q5_1);
        EIC_EM(EI_TYPE_Q8_0);
        EIC_EM(EI_TYPE_Q4_K);
        EIC_EM(EI_TYPE_Q5_K);
        EIC_EM(EI_TYPE_Q6_K);
        EIC_EM(EI_TYPE_Q2_K);
        EIC_EM(EI_TYPE_Q3_K);
        EIC_EM(EI_TYPE_IQ4_NL);
        EIC_EM(EI_TYPE_IQ4_XS);
    default: return cudaErrorInvalidValue;
    }
#undef EIC_EM
}

/* ---------------------------------------------------------------- RMSNorm */
enum { NORM_THREADS = 256 };

__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_kernel(const float *__restrict__ x, const float *__restrict__ w,
                                                               const int32_t *__restrict__ rows, int64_t n, float eps,
                                                               float *__restrict__ out, int accumulate) {
    __shared__ double red[NORM_THREADS / 32];
    __shared__ float scale_s;
    const int64_t t = blockIdx.x;
    const float *xr = x + (rows ? (int64_t)rows[t] : t) * n;
    double ss = 0.0;   /* double, like the CPU reference: rows can be long */
    for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS) ss += (double)xr[i] * (double)xr[i];
    ss = warp_sum_d(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double tot = 0.0;
        for (int i = 0; i < NORM_THREADS / 32; i++) tot += red[i];
        scale_s = (float)(1.0 / sqrt(tot / (double)n + (double)eps));
    }
    __syncthreads();
    const float sc = scale_s;
    float *o = out + t * n;
    if (accumulate) {   /* a post-norm: the normed block output joins the residual */
        for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS) o[i] += xr[i] * sc * w[i];
    } else {
        for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS) o[i] = xr[i] * sc * w[i];
    }
}

cudaError_t eic_rmsnorm(cudaStream_t s, const float *x, const float *w, const int32_t *rows, int64_t n_tok, int64_t n,
                        float eps, float *out) {
    if (n_tok <= 0) return cudaSuccess;
    if (n_tok > 0x7fffffffLL) return cudaErrorInvalidValue;
    rmsnorm_kernel<<<(unsigned)n_tok, NORM_THREADS, 0, s>>>(x, w, rows, n, eps, out, 0);
    return cudaGetLastError();
}

cudaError_t eic_rmsnorm_add(cudaStream_t s, const float *y, const float *w, int64_t n_tok, int64_t n, float eps,
                            float *x) {
    if (n_tok <= 0) return cudaSuccess;
    if (n_tok > 0x7fffffffLL) return cudaErrorInvalidValue;
    rmsnorm_kernel<<<(unsigned)n_tok, NORM_THREADS, 0, s>>>(y, w, NULL, n, eps, x, 1);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- element-wise: scale, softcap, GeGLU */
__global__ void scale_kernel(float *x, int64_t n, float a) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= a;
}

__global__ void softcap_kernel(float *x, int64_t n, float cap) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

/* As the CPU's ei_geglu_scalar: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) * up. */
__global__ void geglu_kernel(float *gate, const float *__restrict__ up, int64_t n, int64_t n_cols, int64_t ld_up) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float x = gate[i];
        const float u = up[i / n_cols * ld_up + i % n_cols];
        gate[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u;
    }
}

__global__ void add_scaled_kernel(float *x, const float *__restrict__ y, int64_t n, float a, float b) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = (x[i] + y[i] * a) * b;
}

static unsigned ew_blocks(int64_t n) {
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b < 65535 ? b : 65535);
}

cudaError_t eic_scale(cudaStream_t s, float *x, int64_t n, float a) {
    if (n <= 0) return cudaSuccess;
    scale_kernel<<<ew_blocks(n), 256, 0, s>>>(x, n, a);
    return cudaGetLastError();
}

cudaError_t eic_softcap(cudaStream_t s, float *x, int64_t n, float cap) {
    if (n <= 0) return cudaSuccess;
    softcap_kernel<<<ew_blocks(n), 256, 0, s>>>(x, n, cap);
    return cudaGetLastError();
}

cudaError_t eic_geglu(cudaStream_t s, float *gate, const float *up, int64_t n) {
    if (n <= 0) return cudaSuccess;
    geglu_kernel<<<ew_blocks(n), 256, 0, s>>>(gate, up, n, n, n);
    return cudaGetLastError();
}

cudaError_t eic_geglu_rows(cudaStream_t s, float *gate, const float *up, int64_t n_rows, int64_t n, int64_t ld_up) {
    if (n_rows <= 0 || n <= 0) return cudaSuccess;
    geglu_kernel<<<ew_blocks(n_rows * n), 256, 0, s>>>(gate, up, n_rows * n, n, ld_up);
    return cudaGetLastError();
}

cudaError_t eic_add_scaled(cudaStream_t s, float *x, const float *y, int64_t n, float a, float b) {
    if (n <= 0) return cudaSuccess;
    add_scaled_kernel<<<ew_blocks(n), 256, 0, s>>>(x, y, n, a, b);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- RoPE and the KV store */
__global__ void rope_tables_kernel(const int32_t *__restrict__ pos, int64_t n_tok, int rope_dim, float theta,
                                   float freq_scale, const float *__restrict__ freqs, float mscale, float *cos_t, float *sin_t,
                                   int32_t *cell_pos, const int32_t *__restrict__ slots,
                                   const int32_t *__restrict__ cells, int32_t n_ctx) {
    const int half = rope_dim / 2;
    const int64_t total = n_tok * (half > 0 ? half : 1);
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        if (half > 0) {
            const int64_t t = k / half;
            const int i = (int)(k % half);
            double freq = pow((double)theta, -2.0 * i / (double)rope_dim);
            if (freqs) freq /= (double)freqs[i];
            const double a = (double)pos[t] * (double)freq_scale * freq;
            cos_t[k] = (float)(cos(a) * (double)mscale);
            sin_t[k] = (float)(sin(a) * (double)mscale);
        }
        if (cell_pos && (half == 0 || k % half == 0)) {
            const int64_t t = half > 0 ? k / half : k;
            cell_pos[(int64_t)slots[t] * n_ctx + cells[t]] = pos[t];
        }
    }
}

cudaError_t eic_rope_tables(cudaStream_t s, const int32_t *pos, int64_t n_tok, int rope_dim, float theta,
                            float freq_scale, const float *freqs, float mscale, float *cos_t, float *sin_t,
                            int32_t *cell_pos, const int32_t *slots, const int32_t *cells, int32_t n_ctx) {
    if (n_tok <= 0) return cudaSuccess;
    const int64_t total = n_tok * (rope_dim / 2 > 0 ? rope_dim / 2 : 1);
    const unsigned blocks = (unsigned)((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
    rope_tables_kernel<<<blocks, 256, 0, s>>>(pos, n_tok, rope_dim, theta, freq_scale, freqs, mscale > 0 ? mscale : 1.0f,
                                              cos_t, sin_t, cell_pos,
                                              slots, cells, n_ctx);
    return cudaGetLastError();
}

/* 1 / sqrt(mean v^2 + eps) of a head of hd floats, over the block (64 threads); double sums as the CPU. */
__device__ float head_rms_scale(const float *v, int hd, float eps, double *red) {
    double ss = 0.0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += (double)v[i] * (double)v[i];
    red[threadIdx.x] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double tot = 0.0;
        for (int i = 0; i < (int)blockDim.x; i++) tot += red[i];
        red[0] = tot;
    }
    __syncthreads();
    const float sc = (float)(1.0 / sqrt(red[0] / (double)hd + (double)eps));
    __syncthreads();   /* every thread has read red[0] before the next use writes it */
    return sc;
}

/* Element offset of (slot, layer, kv head, cell) in an arena. */
__device__ __forceinline__ size_t kv_at(const eic_kv &kv, int slot, int layer, int kvh, int cell) {
    const int64_t stride = kv.slot_stride ? kv.slot_stride : (int64_t)kv.n_layer * kv.n_head_kv * kv.n_ctx * kv.hd;
    return (size_t)slot * stride + (((size_t)layer * kv.n_head_kv + kvh) * kv.n_ctx + cell) * (size_t)kv.hd;
}

/* One block per (token, head) over q heads then kv heads; a thread per rotated pair. */
__global__ void rope_store_kernel(float *q, float *kc, const float *__restrict__ vc, int n_head, int n_head_kv, int hd,
                                  int rope_dim, int neox, const float *__restrict__ cos_t,
                                  const float *__restrict__ sin_t, eic_kv kv, int layer,
                                  const int32_t *__restrict__ slots, const int32_t *__restrict__ cells,
                                  eic_qk_norm qkn) {
    __shared__ double red[64];
    const int64_t t = blockIdx.y;
    const int h = blockIdx.x;
    const int half = rope_dim / 2;
    const bool is_q = h < n_head;
    const int kvh = h - n_head;
    float *v = is_q ? q + (t * n_head + h) * hd : kc + (t * n_head_kv + kvh) * hd;
    const float *cs = cos_t + t * half, *sn = sin_t + t * half;
    const float *nw = is_q ? qkn.q : qkn.k;
    if (nw) {   /* per-head RMSNorm (Qwen3, Gemma 3) before the rotation */
        const float sc = head_rms_scale(v, hd, qkn.eps, red);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = v[i] * sc * nw[i];
        __syncthreads();
    }
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cs[i] - x1 * sn[i];
        v[i1] = x0 * sn[i] + x1 * cs[i];
    }
    if (is_q) return;
    __syncthreads();
    const size_t off = kv_at(kv, slots[t], layer, kvh, cells[t]);
    const float *vv = vc + (t * n_head_kv + kvh) * hd;
    const float vs = qkn.v ? head_rms_scale(vv, hd, qkn.eps, red) : 1.0f;   /* Gemma 4's v norm: no weight */
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        kv.k[off + i] = __half_as_ushort(__float2half_rn(v[i]));
        kv.v[off + i] = __half_as_ushort(__float2half_rn(qkn.v ? vv[i] * vs : vv[i]));
    }
}

cudaError_t eic_rope_store(cudaStream_t s, float *q, float *kc, const float *vc, int64_t n_tok, int n_head,
                           int n_head_kv, int hd, int rope_dim, int neox, const float *cos_t, const float *sin_t,
                           const eic_kv *kv, int layer, const int32_t *slots, const int32_t *cells,
                           const eic_qk_norm *qk_norm) {
    const eic_qk_norm qkn = qk_norm ? *qk_norm : eic_qk_norm{};
    if (n_tok <= 0) return cudaSuccess;
    const int heads = n_head + (kc ? n_head_kv : 0);
    eic_kv k = kv ? *kv : eic_kv{};
    for (int64_t t = 0; t < n_tok; t += 65535) {
        const int64_t nt = n_tok - t < 65535 ? n_tok - t : 65535;
        rope_store_kernel<<<dim3((unsigned)heads, (unsigned)nt), 64, 0, s>>>(
            q + t * n_head * hd, kc ? kc + t * n_head_kv * hd : NULL, vc ? vc + t * n_head_kv * hd : NULL, n_head,
            n_head_kv, hd, rope_dim, neox, cos_t + t * (rope_dim / 2), sin_t + t * (rope_dim / 2), k, layer,
            slots ? slots + t : NULL, cells ? cells + t : NULL, qkn);
    }
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- SwiGLU */
__global__ void swiglu_kernel(float *gate, const float *__restrict__ up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

cudaError_t eic_swiglu(cudaStream_t s, float *gate, const float *up, int64_t n) {
    if (n <= 0) return cudaSuccess;
    const int64_t b = (n + 255) / 256;
    swiglu_kernel<<<(unsigned)(b < 65535 ? b : 65535), 256, 0, s>>>(gate, up, n);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- attention */
enum { ATT_THREADS = 32 * EIC_ATTN_WARPS, ATT_WARPS = EIC_ATTN_WARPS, ATT_HEADS = 4 };

/* Block (chunk, kv head, token): partial softmax of the chunk's cells for the
 * g query heads of the group, as the CPU's ei_attend_chunk. Shared memory (EIC_ATTN_SMEM):
 * q[g][hd] (scaled; afterwards the warps' V sums) then scores[g][EIC_ATTN_CHUNK]. Every load
 * of a loop is independent of the last, so a warp keeps many in flight: one token's chunk is
 * a handful of blocks, bound by memory latency, not bandwidth. KR: registers per lane for a
 * V row, hd <= 32 * KR (8 up to 256; 16 for Gemma 4's heads of 512). */
template <int KR>
__global__ void __launch_bounds__(ATT_THREADS) attn_chunk_kernel(
    const float *__restrict__ q, int n_head, eic_kv kv, int layer, const int32_t *__restrict__ slots,
    const int32_t *__restrict__ pos, const int32_t *__restrict__ n_cells, const int32_t *__restrict__ cell_pos,
    int n_chunks, float *__restrict__ part, float scale, int32_t window, int32_t keep_below) {
    extern __shared__ float sm[];
    const int chunk = blockIdx.x, kvh = blockIdx.y;
    const int64_t t = blockIdx.z;
    const int hd = kv.hd, g = n_head / kv.n_head_kv, pf = EIC_PART_FLOATS(hd);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *pt = part + (((t * kv.n_head_kv + kvh) * n_chunks + chunk) * g) * pf;
    const int slot = slots[t], p = pos[t];
    const int c0 = chunk * EIC_ATTN_CHUNK, c1 = min(c0 + EIC_ATTN_CHUNK, n_cells[t]);
    if (c0 >= c1) {
        for (int j = threadIdx.x; j < g; j += ATT_THREADS) {
            pt[(int64_t)j * pf] = -INFINITY;
            pt[(int64_t)j * pf + 1] = 0.0f;
        }
        return;
    }
    const int n = c1 - c0;
    float *qs = sm, *sc = sm + (g > ATT_WARPS ? g : ATT_WARPS) * hd;
    const float *qt = q + (t * n_head + (int64_t)kvh * g) * hd;
    for (int i = threadIdx.x; i < g * hd; i += ATT_THREADS) qs[i] = qt[i] * scale;
    __syncthreads();
    const size_t off = kv_at(kv, slot, layer, kvh, 0);
    const __half *K = (const __half *)kv.k + off, *V = (const __half *)kv.v + off;
    const int32_t *cp = cell_pos + (int64_t)slot * kv.n_ctx;
    /* Scores: a thread per cell, its key row read in pairs, up to ATT_HEADS heads a pass (q from
     * shared memory: every lane reads the same word). */
    for (int c = threadIdx.x; c < n; c += ATT_THREADS) {
        const int32_t cpos = cp[c0 + c];
        const bool vis = cpos >= 0 && cpos <= p && (window <= 0 || cpos > p - window || cpos < keep_below);
        if (!vis) {
            for (int j = 0; j < g; j++) sc[j * EIC_ATTN_CHUNK + c] = -INFINITY;
            continue;
        }
        const __half *kc = K + (size_t)(c0 + c) * hd;
        for (int j0 = 0; j0 < g; j0 += ATT_HEADS) {
            const int nj = min(ATT_HEADS, g - j0);
            const float *qj = qs + j0 * hd;
            float s[ATT_HEADS] = {0.0f, 0.0f, 0.0f, 0.0f};
            if ((hd & 7) == 0) {   /* 16-byte loads: rows start at multiples of hd halves */
#pragma unroll 2
                for (int i = 0; i < hd; i += 8) {
                    const uint4 raw = *(const uint4 *)(kc + i);
                    const __half2 *h2 = (const __half2 *)&raw;
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const float2 k2 = __half22float2(h2[u]);
#pragma unroll
                        for (int jj = 0; jj < ATT_HEADS; jj++)
                            if (jj < nj)
                                s[jj] += k2.x * qj[jj * hd + i + 2 * u] + k2.y * qj[jj * hd + i + 2 * u + 1];
                    }
                }
            } else if ((hd & 1) == 0) {
#pragma unroll 4
                for (int i = 0; i < hd; i += 2) {
                    const float2 k2 = __half22float2(*(const __half2 *)(kc + i));
#pragma unroll
                    for (int jj = 0; jj < ATT_HEADS; jj++)
                        if (jj < nj) s[jj] += k2.x * qj[jj * hd + i] + k2.y * qj[jj * hd + i + 1];
                }
            } else {
                for (int i = 0; i < hd; i++) {
                    const float k1 = __half2float(kc[i]);
#pragma unroll
                    for (int jj = 0; jj < ATT_HEADS; jj++)
                        if (jj < nj) s[jj] += k1 * qj[jj * hd + i];
                }
            }
#pragma unroll
            for (int jj = 0; jj < ATT_HEADS; jj++)
                if (jj < nj) sc[(j0 + jj) * EIC_ATTN_CHUNK + c] = s[jj];
        }
    }
    __syncthreads();
    /* Max, exp and sum per head: a warp per head. Masked cells get weight 0. */
    for (int j = warp; j < g; j += ATT_WARPS) {
        float *sj = sc + j * EIC_ATTN_CHUNK;
        float mx = -INFINITY;
        for (int c = lane; c < n; c += 32) mx = fmaxf(mx, sj[c]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int c = lane; c < n; c += 32) {
            const float e = (mx == -INFINITY || sj[c] == -INFINITY) ? 0.0f : __expf(sj[c] - mx);
            sj[c] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            pt[(int64_t)j * pf] = mx;
            pt[(int64_t)j * pf + 1] = sum;
        }
    }
    /* Weighted V: a warp per cell (every ATT_WARPS-th), the lanes across the row, up to
     * ATT_HEADS heads a pass; then the warps' sums are added in shared memory (q's place).
     * A masked cell's V is read but not used (a cell never written may hold anything). */
    float *red = qs;
    for (int j0 = 0; j0 < g; j0 += ATT_HEADS) {
        const int nj = min(ATT_HEADS, g - j0);
        __syncthreads();   /* the weights are final; the last pass's sums are read */
        float acc[ATT_HEADS][KR];
#pragma unroll
        for (int jj = 0; jj < ATT_HEADS; jj++)
#pragma unroll
            for (int e = 0; e < KR; e++) acc[jj][e] = 0.0f;
#pragma unroll 4
        for (int c = warp; c < n; c += ATT_WARPS) {
            const __half *vc = V + (size_t)(c0 + c) * hd;
            float vr[KR];
#pragma unroll
            for (int e = 0; e < KR; e++) {
                const int i = lane + 32 * e;
                vr[e] = i < hd ? __half2float(vc[i]) : 0.0f;
            }
#pragma unroll
            for (int jj = 0; jj < ATT_HEADS; jj++) {
                if (jj >= nj) break;
                const float w = sc[(j0 + jj) * EIC_ATTN_CHUNK + c];
#pragma unroll
                for (int e = 0; e < KR; e++) acc[jj][e] += w != 0.0f ? w * vr[e] : 0.0f;
            }
        }
#pragma unroll
        for (int jj = 0; jj < ATT_HEADS; jj++) {   /* unrolled: acc stays in registers */
            if (jj >= nj) break;
#pragma unroll
            for (int e = 0; e < KR; e++) {
                const int i = lane + 32 * e;
                if (i < hd) red[warp * hd + i] = acc[jj][e];
            }
            __syncthreads();
            for (int i = threadIdx.x; i < hd; i += ATT_THREADS) {
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < ATT_WARPS; w++) v += red[w * hd + i];
                pt[(int64_t)(j0 + jj) * pf + 2 + i] = v;
            }
            __syncthreads();
        }
    }
}

/* Block (head, token): merge the chunk partials in order (as ei_attend_merge). */
__global__ void attn_merge_kernel(const float *__restrict__ part, int n_head, int n_head_kv, int hd, int n_chunks,
                                  float *__restrict__ out) {
    const int h = blockIdx.x;
    const int64_t t = blockIdx.y;
    const int g = n_head / n_head_kv, kvh = h / g, j = h % g, pf = EIC_PART_FLOATS(hd);
    const float *base = part + (((t * n_head_kv + kvh) * n_chunks) * g + j) * pf;
    const int64_t stride = (int64_t)g * pf;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float m = -INFINITY, s = 0.0f, o = 0.0f;
        for (int c = 0; c < n_chunks; c++) {
            const float *pc = base + c * stride;
            const float pm = pc[0];
            if (pm == -INFINITY) continue;
            const float mn = fmaxf(pm, m);
            const float a = m == -INFINITY ? 0.0f : expf(m - mn), b = expf(pm - mn);
            o = o * a + pc[2 + i] * b;
            s = s * a + pc[1] * b;
            m = mn;
        }
        out[(t * n_head + h) * hd + i] = s > 0.0f ? o / s : 0.0f;
    }
}

cudaError_t eic_attention(cudaStream_t s, const float *q, int64_t n_tok, int n_head, const eic_kv *kv, int layer,
                          const int32_t *slots, const int32_t *pos, const int32_t *n_cells, const int32_t *cell_pos,
                          int n_chunks, float *part, float *out, float scale, int32_t window,
                          int32_t keep_below) {
    if (n_tok <= 0) return cudaSuccess;
    const int g = n_head / kv->n_head_kv;
    if (kv->hd > EIC_MAX_HEAD_DIM || g > EIC_MAX_GROUP || n_chunks < 1 || n_tok > 65535) return cudaErrorInvalidValue;
    const size_t smem = EIC_ATTN_SMEM(g, kv->hd);
    void (*kern)(const float *, int, eic_kv, int, const int32_t *, const int32_t *, const int32_t *, const int32_t *,
                 int, float *, float, int32_t, int32_t) = kv->hd <= 256 ? attn_chunk_kernel<8> : attn_chunk_kernel<16>;
    if (smem > 48 * 1024) {   /* large GQA groups or heads: opt in to more than the default 48 KiB */
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    kern<<<dim3((unsigned)n_chunks, (unsigned)kv->n_head_kv, (unsigned)n_tok), ATT_THREADS, smem, s>>>(
        q, n_head, *kv, layer, slots, pos, n_cells, cell_pos, n_chunks, part,
        scale > 0.0f ? scale : rsqrtf((float)kv->hd), window, keep_below);
    attn_merge_kernel<<<dim3((unsigned)n_head, (unsigned)n_tok), kv->hd < 128 ? 64 : 128, 0, s>>>(
        part, n_head, kv->n_head_kv, kv->hd, n_chunks, out);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- argmax */
__global__ void argmax_kernel(const float *__restrict__ x, int64_t n, int32_t *out) {
    __shared__ float bv[32];
    __shared__ int32_t bi[32];
    const float *r = x + (int64_t)blockIdx.x * n;
    float best = -INFINITY;
    int32_t idx = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        if (r[i] > best) {   /* NaN never wins; the first maximum wins */
            best = r[i];
            idx = (int32_t)i;
        }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) {
            best = ov;
            idx = oi;
        }
    }
    if ((threadIdx.x & 31) == 0) {
        bv[threadIdx.x >> 5] = best;
        bi[threadIdx.x >> 5] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (bv[w] > best || (bv[w] == best && bi[w] < idx)) {
                best = bv[w];
                idx = bi[w];
            }
        out[blockIdx.x] = idx;
    }
}

cudaError_t eic_argmax(cudaStream_t s, const float *x, int64_t n_rows, int64_t n, int32_t *out) {
    if (n_rows <= 0) return cudaSuccess;
    argmax_kernel<<<(unsigned)n_rows, 256, 0, s>>>(x, n, out);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- top-k */
/* The order of top-k: value descending, ties to the lower id (np.argsort(-x, kind="stable")). */
__device__ __forceinline__ bool topk_before(float a, int32_t ia, float b, int32_t ib) {
    return a > b || (a == b && ia < ib);
}

/* (*bv, *bi) = the first in topk_before order of r[i], i = first, first + step, ... < n, among
 * those strictly after (pv, pi); (-inf, INT32_MAX) when none is. NaN reads as -inf. */
__device__ void topk_scan(const float *__restrict__ r, int64_t n, int64_t first, int64_t step, float pv, int32_t pi,
                          float *bv, int32_t *bi) {
    float best = -INFINITY;
    int32_t idx = INT32_MAX;
    for (int64_t i = first; i < n; i += step) {
        const float x = r[i], v = isnan(x) ? -INFINITY : x;
        if (topk_before(pv, pi, v, (int32_t)i) && topk_before(v, (int32_t)i, best, idx)) {
            best = v;
            idx = (int32_t)i;
        }
    }
    *bv = best;
    *bi = idx;
}

/* Every lane gets the first of the warp's (v, i) in topk_before order. */
__device__ __forceinline__ void topk_warp_best(float *v, int32_t *i) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (topk_before(ov, oi, *v, *i)) {
            *v = ov;
            *i = oi;
        }
    }
}

#define TOPK_THREADS 256
/* One block per row, k rounds of a block-wide argmax. Thread t owns the elements i with
 * i % TOPK_THREADS == t and keeps the best of them not yet picked; a round picks the best of
 * those, and only the owner of the pick looks for its next one, with the 31 other lanes of its
 * warp: the row is read about once, not k times, and a round costs a few loads per lane. */
__global__ void topk_kernel(const float *__restrict__ x, int64_t n, int k, int32_t *ids, float *vals) {
    extern __shared__ float topk_sm[];   /* the best (value, id) of each warp */
    float *wv = topk_sm;
    int32_t *wi = (int32_t *)(topk_sm + TOPK_THREADS / 32);
    const float *r = x + (int64_t)blockIdx.x * n;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float bv;
    int32_t bi;
    topk_scan(r, n, threadIdx.x, TOPK_THREADS, INFINITY, -1, &bv, &bi);
    for (int j = 0; j < k; j++) {
        float v = bv;
        int32_t i = bi;
        topk_warp_best(&v, &i);
        if (lane == 0) {
            wv[warp] = v;
            wi[warp] = i;
        }
        __syncthreads();
        for (int w = 0; w < TOPK_THREADS / 32; w++)
            if (topk_before(wv[w], wi[w], v, i)) {
                v = wv[w];
                i = wi[w];
            }
        __syncthreads();   /* every thread has read wv / wi before the next round writes them */
        if (threadIdx.x == 0) {
            ids[(int64_t)blockIdx.x * k + j] = i;
            vals[(int64_t)blockIdx.x * k + j] = v;
        }
        const int owner = i % TOPK_THREADS;
        if (owner >> 5 == warp) {   /* uniform over the warp: all 32 lanes shuffle */
            float cv;
            int32_t ci;
            topk_scan(r, n, owner + (int64_t)lane * TOPK_THREADS, 32 * TOPK_THREADS, v, i, &cv, &ci);
            topk_warp_best(&cv, &ci);
            if (lane == (owner & 31)) {
                bv = cv;
                bi = ci;
            }
        }
    }
}
cudaError_t eic_topk(cudaStream_t s, const float *x, int64_t n_rows, int64_t n, int k, int32_t *ids, float *vals) {
    if (n_rows <= 0) return cudaSuccess;
    if (k < 1 || k > EIC_TOPK_MAX || k > n || n > INT32_MAX) return cudaErrorInvalidValue;
    topk_kernel<<<(unsigned)n_rows, TOPK_THREADS, TOPK_THREADS / 32 * 8, s>>>(x, n, k, ids, vals);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- LoRA (gathered rows) */
enum { LORA_THREADS = 128 };

/* Block (i, k): t[i*rank + k] = A[k] . x[rows[i]] (f32 dot, a block-wide sum). */
__global__ void __launch_bounds__(LORA_THREADS) lora_down_kernel(const float *__restrict__ A, int rank, int64_t n_cols,
                                                                 const float *__restrict__ x, int64_t ldx,
                                                                 const int32_t *__restrict__ rows, float *__restrict__ t) {
    __shared__ float red[LORA_THREADS / 32];
    const int64_t i = blockIdx.x;
    const int k = blockIdx.y;
    const float *a = A + (int64_t)k * n_cols, *xr = x + (int64_t)rows[i] * ldx;
    float acc = 0.0f;
    for (int64_t c = threadIdx.x; c < n_cols; c += LORA_THREADS) acc += a[c] * xr[c];
    acc = warp_sum(acc);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float tot = 0.0f;
        for (int w = 0; w < LORA_THREADS / 32; w++) tot += red[w];
        t[i * rank + k] = tot;
    }
}

/* Thread r of block (i, r / LORA_THREADS): y[rows[i]*ldy + r] += scale[i] * B[r] . t[i]. */
__global__ void __launch_bounds__(LORA_THREADS) lora_up_kernel(const float *__restrict__ B, int64_t n_out, int rank,
                                                               const float *__restrict__ t, const int32_t *__restrict__ rows,
                                                               const float *__restrict__ scale, float *y, int64_t ldy) {
    const int64_t i = blockIdx.x, r = (int64_t)blockIdx.y * LORA_THREADS + threadIdx.x;
    if (r >= n_out) return;
    const float *b = B + r * rank, *ti = t + i * rank;
    float acc = 0.0f;
    for (int k = 0; k < rank; k++) acc += b[k] * ti[k];
    y[(int64_t)rows[i] * ldy + r] += scale[i] * acc;
}

cudaError_t eic_lora_down(cudaStream_t s, const float *A, int rank, int64_t n_cols, const float *x, int64_t ldx,
                          const int32_t *rows, int64_t n, float *t) {
    if (n <= 0) return cudaSuccess;
    if (rank < 1 || rank > 65535 || n > 0x7fffffffLL || n_cols < 1) return cudaErrorInvalidValue;
    lora_down_kernel<<<dim3((unsigned)n, (unsigned)rank), LORA_THREADS, 0, s>>>(A, rank, n_cols, x, ldx, rows, t);
    return cudaGetLastError();
}

cudaError_t eic_lora_up(cudaStream_t s, const float *B, int64_t n_out, int rank, const float *t, const int32_t *rows,
                        const float *scale, int64_t n, float *y, int64_t ldy) {
    if (n <= 0) return cudaSuccess;
    const int64_t blocks = (n_out + LORA_THREADS - 1) / LORA_THREADS;
    if (rank < 1 || n > 0x7fffffffLL || blocks < 1 || blocks > 65535) return cudaErrorInvalidValue;
    lora_up_kernel<<<dim3((unsigned)n, (unsigned)blocks), LORA_THREADS, 0, s>>>(B, n_out, rank, t, rows, scale, y, ldy);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------- recurrent layers (LFM2, Qwen3.5) */
/* Row t's slot state block of this layer, and its kept copy rs.keep[t] (>= 0) if the row keeps one. */
__device__ __forceinline__ float *rstate_live(const eic_rstate &rs, int64_t t) {
    return rs.state + (int64_t)rs.slots[t] * rs.stride + rs.off;
}
__device__ __forceinline__ float *rstate_kept(const eic_rstate &rs, int64_t t) {
    const int32_t k = rs.keep[t];
    return k < 0 ? NULL : rs.snap + ((int64_t)rs.slots[t] * rs.n_snap + k) * rs.stride + rs.off;
}

/* A thread per channel runs the rows in order (a slot's rows continue its window; slots may
 * interleave), so a window is only ever read and written by its own thread. */
__global__ void conv1d_state_kernel(int mode, const float *__restrict__ in, const float *__restrict__ w, int K,
                                    int64_t ch, int64_t n_tok, eic_rstate rs, float *__restrict__ y) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    float tap[EIC_CONV_MAX_K];
    for (int k = 0; k < K; k++) tap[k] = w[c * K + k];
    for (int64_t t = 0; t < n_tok; t++) {
        float *win = rstate_live(rs, t);   /* [K - 1][ch], oldest first */
        const float u = mode == EIC_CONV_SHORTCONV ? in[t * 3 * ch + c] * in[t * 3 * ch + 2 * ch + c] : in[t * ch + c];
        float acc = 0.0f;
        for (int k = 0; k < K - 1; k++) acc += tap[k] * win[k * ch + c];
        acc += tap[K - 1] * u;
        for (int k = 0; k + 1 < K - 1; k++) win[k * ch + c] = win[(k + 1) * ch + c];
        win[(int64_t)(K - 2) * ch + c] = u;
        y[t * ch + c] = mode == EIC_CONV_SHORTCONV ? in[t * 3 * ch + ch + c] * acc : acc / (1.0f + expf(-acc));
        float *kept = rstate_kept(rs, t);
        if (kept)
            for (int k = 0; k < K - 1; k++) kept[k * ch + c] = win[k * ch + c];
    }
}

cudaError_t eic_conv1d_state(cudaStream_t s, int mode, const float *in, const float *w, int K, int64_t ch,
                             int64_t n_tok, const eic_rstate *rs, float *y) {
    if (n_tok <= 0) return cudaSuccess;
    if (K < 2 || K > EIC_CONV_MAX_K || ch < 1 || !rs) return cudaErrorInvalidValue;
    const int64_t blocks = (ch + 127) / 128;
    if (blocks > 65535) return cudaErrorInvalidValue;
    conv1d_state_kernel<<<(unsigned)blocks, 128, 0, s>>>(mode, in, w, K, ch, n_tok, *rs, y);
    return cudaGetLastError();
}

/* Block h (a value head), thread j < dv: column j of the head's state S [dk][dv] in registers while
 * the rows of one slot run; q and k (key head h % nk) L2-normed in shared memory per row. As the
 * CPU's ei_delta_step: S = exp(g) S; delta = beta (v - S^T k); S += k delta^T; o = S^T q. */
__global__ void delta_rule_kernel(eic_delta_args a, int64_t n_tok, eic_rstate rs) {
    __shared__ float qs[EIC_MAX_SSM_DK], ks[EIC_MAX_SSM_DK], norms[2];
    const int h = blockIdx.x, j = threadIdx.x, dk = a.dk, dv = a.dv, kh = h % a.nk;
    const int64_t cd = (int64_t)(2 * a.nk) * dk + (int64_t)a.nv * dv, hoff = (int64_t)h * dk * dv;
    float col[EIC_MAX_SSM_DK];
    int32_t cur = -1;   /* the slot whose column is in col */
    const float a_neg = a.a[h], dt = a.dt[h];
    for (int64_t t = 0; t < n_tok; t++) {
        const float *row = a.qkv + t * cd;
        for (int i = j; i < dk; i += blockDim.x) {
            qs[i] = row[(int64_t)kh * dk + i];
            ks[i] = row[(int64_t)(a.nk + kh) * dk + i];
        }
        __syncthreads();
        if (j < 32) {   /* warp 0: the two squared norms */
            float sq = 0.0f, sk = 0.0f;
            for (int i = j; i < dk; i += 32) sq += qs[i] * qs[i], sk += ks[i] * ks[i];
            sq = warp_sum(sq);
            sk = warp_sum(sk);
            if (j == 0) {
                norms[0] = rsqrtf(sq + EIC_L2_EPS) * rsqrtf((float)dk);   /* q also scaled by 1/sqrt(d_k) */
                norms[1] = rsqrtf(sk + EIC_L2_EPS);
            }
        }
        __syncthreads();
        const float nq = norms[0], nk = norms[1];
        const int32_t slot = rs.slots[t];
        if (j < dv) {
            float *S = rs.state + (int64_t)slot * rs.stride + rs.off + hoff;
            if (slot != cur) {
                if (cur >= 0) {
                    float *P = rs.state + (int64_t)cur * rs.stride + rs.off + hoff;
                    for (int i = 0; i < dk; i++) P[(int64_t)i * dv + j] = col[i];
                }
                for (int i = 0; i < dk; i++) col[i] = S[(int64_t)i * dv + j];
                cur = slot;
            }
            const float x = a.alpha[t * a.nv + h] + dt;
            const float g = a_neg * (x > 20.0f ? x : log1pf(expf(x)));
            const float decay = expf(g), beta = 1.0f / (1.0f + expf(-a.beta[t * a.nv + h]));
            float kv = 0.0f;
            for (int i = 0; i < dk; i++) {
                col[i] *= decay;
                kv += col[i] * (ks[i] * nk);
            }
            const float delta = beta * (row[(int64_t)2 * a.nk * dk + (int64_t)h * dv + j] - kv);
            float o = 0.0f;
            for (int i = 0; i < dk; i++) {
                col[i] += ks[i] * nk * delta;
                o += col[i] * (qs[i] * nq);
            }
            a.o[t * (int64_t)a.nv * dv + (int64_t)h * dv + j] = o;
            float *kept = rstate_kept(rs, t);
            if (kept)
                for (int i = 0; i < dk; i++) kept[hoff + (int64_t)i * dv + j] = col[i];
        }
        __syncthreads();   /* every thread has read qs / ks before the next row overwrites them */
    }
    if (j < dv && cur >= 0) {
        float *P = rs.state + (int64_t)cur * rs.stride + rs.off + hoff;
        for (int i = 0; i < dk; i++) P[(int64_t)i * dv + j] = col[i];
    }
}

/* Shapes both delta-rule kernels take: a block of dv threads per value head. */
static bool delta_args_ok(const eic_delta_args *a, const eic_rstate *rs) {
    return a && rs && a->dk >= 1 && a->dk <= EIC_MAX_SSM_DK && a->dv >= 1 && a->dv <= 1024 && a->nk >= 1 &&
           a->nv >= 1 && a->nv <= 65535;
}

cudaError_t eic_delta_rule(cudaStream_t s, const eic_delta_args *a, int64_t n_tok, const eic_rstate *rs) {
    if (n_tok <= 0) return cudaSuccess;
    if (!delta_args_ok(a, rs)) return cudaErrorInvalidValue;
    const int threads = (a->dv + 31) / 32 * 32;
    delta_rule_kernel<<<(unsigned)a->nv, threads, 0, s>>>(*a, n_tok, *rs);
    return cudaGetLastError();
}

/* The chunked form of the same rule over one slot's run of rows (a block per value head, thread j <
 * dv holding column j of S as above), by chunks of m <= EI_DELTA_CHUNK rows, as the CPU's
 * ei_delta_chunked (native/src/deltanet_impl.h; edgeinfer/arch/deltanet.py): with c_i the
 * cumulative log decay in the chunk and S0 the state before it,
 *   u_i = beta_i (v_i - exp(c_i) S0^T k_i) + sum_{j<i} A_ij u_j,  A_ij = -beta_i exp(c_i - c_j) (k_i.k_j)
 *   o_i = exp(c_i) S0^T q_i + sum_{j<=i} P_ij u_j,             P_ij = exp(c_i - c_j) (q_i.k_j)
 *   S   = exp(c_last) S0 + sum_j exp(c_last - c_j) k_j u_j^T
 * A and P are built once per chunk by all threads in shared memory; a column of u depends only on
 * the same column (the forward substitution runs per thread, in registers). The state is kept
 * after the run's last row (runs are cut after keep rows). */
__global__ void delta_chunked_kernel(eic_delta_args a, int64_t n_tok, eic_rstate rs) {
    enum { C = EI_DELTA_CHUNK };
    __shared__ float am[C][C + 1], pm[C][C + 1];
    __shared__ float nq[C], nkk[C], cc[C], bb[C];
    const int h = blockIdx.x, j = threadIdx.x, nth = blockDim.x, dk = a.dk, dv = a.dv, kh = h % a.nk;
    const int lane = j & 31, warp = j >> 5, n_warps = nth >> 5;
    const int64_t cd = (int64_t)(2 * a.nk) * dk + (int64_t)a.nv * dv, hoff = (int64_t)h * dk * dv;
    const int64_t qo = (int64_t)kh * dk, ko = (int64_t)(a.nk + kh) * dk, vo = (int64_t)2 * a.nk * dk + (int64_t)h * dv;
    float *S = rs.state + (int64_t)rs.slots[0] * rs.stride + rs.off + hoff;
    float col[EIC_MAX_SSM_DK], u[C];
    if (j < dv)
        for (int i = 0; i < dk; i++) col[i] = S[(int64_t)i * dv + j];
    const float a_neg = a.a[h], dt = a.dt[h];
    for (int64_t c0 = 0; c0 < n_tok; c0 += C) {
        const int m = (int)(n_tok - c0 < C ? n_tok - c0 : C);
        const float *rows = a.qkv + c0 * cd;
        for (int i = warp; i < m; i += n_warps) {   /* a warp per row: norms, log decay, beta */
            const float *row = rows + i * cd;
            float sq = 0.0f, sk = 0.0f;
            for (int p = lane; p < dk; p += 32) sq += row[qo + p] * row[qo + p], sk += row[ko + p] * row[ko + p];
            sq = warp_sum(sq);
            sk = warp_sum(sk);
            if (lane == 0) {
                nq[i] = rsqrtf(sq + EIC_L2_EPS) * rsqrtf((float)dk);   /* q also scaled by 1/sqrt(d_k) */
                nkk[i] = rsqrtf(sk + EIC_L2_EPS);
                const float x = a.alpha[(c0 + i) * a.nv + h] + dt;
                cc[i] = a_neg * (x > 20.0f ? x : log1pf(expf(x)));
                bb[i] = 1.0f / (1.0f + expf(-a.beta[(c0 + i) * a.nv + h]));
            }
        }
        __syncthreads();
        if (j == 0)   /* the cumulative log decay */
            for (int i = 1; i < m; i++) cc[i] += cc[i - 1];
        __syncthreads();
        for (int e = j; e < m * m; e += nth) {   /* the lower triangles of A and P */
            const int i = e / m, jj = e % m;
            if (jj > i) continue;
            const float *ri = rows + i * cd, *kj = rows + jj * cd + ko;
            float kk = 0.0f, qk = 0.0f;
            for (int p = 0; p < dk; p++) kk += ri[ko + p] * kj[p], qk += ri[qo + p] * kj[p];
            const float dec = expf(cc[i] - cc[jj]);
            am[i][jj] = jj < i ? -bb[i] * dec * kk * nkk[i] * nkk[jj] : 0.0f;
            pm[i][jj] = dec * qk * nq[i] * nkk[jj];
        }
        __syncthreads();
        if (j < dv) {
            for (int i = 0; i < m; i++) {   /* in row order: u_j (j < i) is final when row i reads it */
                const float *row = rows + i * cd;
                float sk = 0.0f, sq = 0.0f;
                for (int p = 0; p < dk; p++) sk += col[p] * row[ko + p], sq += col[p] * row[qo + p];
                const float e = expf(cc[i]);
                float ui = bb[i] * (row[vo + j] - e * sk * nkk[i]);
                for (int jj = 0; jj < i; jj++) ui += am[i][jj] * u[jj];
                u[i] = ui;
                float o = e * sq * nq[i];
                for (int jj = 0; jj <= i; jj++) o += pm[i][jj] * u[jj];
                a.o[(c0 + i) * (int64_t)a.nv * dv + (int64_t)h * dv + j] = o;
            }
            const float last = cc[m - 1];
            for (int i = 0; i < m; i++) u[i] *= expf(last - cc[i]) * nkk[i];   /* k_i's norm folded in */
            const float el = expf(last);
            for (int p = 0; p < dk; p++) {
                float sp = el * col[p];
                for (int i = 0; i < m; i++) sp += rows[i * cd + ko + p] * u[i];
                col[p] = sp;
            }
        }
        __syncthreads();   /* every thread is done with the chunk's shared arrays */
    }
    if (j < dv) {
        float *kept = rstate_kept(rs, n_tok - 1);
        for (int i = 0; i < dk; i++) {
            S[(int64_t)i * dv + j] = col[i];
            if (kept) kept[hoff + (int64_t)i * dv + j] = col[i];
        }
    }
}

cudaError_t eic_delta_rule_chunked(cudaStream_t s, const eic_delta_args *a, int64_t n_tok, const eic_rstate *rs) {
    if (n_tok <= 0) return cudaSuccess;
    if (!delta_args_ok(a, rs)) return cudaErrorInvalidValue;
    const int threads = (a->dv + 31) / 32 * 32;
    delta_chunked_kernel<<<(unsigned)a->nv, threads, 0, s>>>(*a, n_tok, *rs);
    return cudaGetLastError();
}

/* A warp per row: x = x / sqrt(mean x^2 + eps) * w * silu(gate), as the CPU's gated_norm. */
__global__ void gated_norm_kernel(float *x, const float *__restrict__ w, const float *__restrict__ gate, int64_t n_rows,
                                  int d, float eps) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= n_rows) return;   /* whole warps leave together: their shuffles see every lane */
    float *xr = x + r * d;
    const float *gr = gate + r * d;
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    const float sc = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = lane; i < d; i += 32) {
        const float g = gr[i];
        xr[i] = xr[i] * sc * w[i] * (g / (1.0f + expf(-g)));
    }
}

cudaError_t eic_gated_norm(cudaStream_t s, float *x, const float *w, const float *gate, int64_t n_rows, int d,
                           float eps) {
    if (n_rows <= 0) return cudaSuccess;
    const int64_t blocks = (n_rows + 3) / 4;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    gated_norm_kernel<<<(unsigned)blocks, 128, 0, s>>>(x, w, gate, n_rows, d, eps);
    return cudaGetLastError();
}

/* Gated attention (Qwen3.5): attn_q gave [t][head][query hd, gate hd]; the queries to q [t][qd],
 * the gates to gate [t][qd]. */
__global__ void split_gate_kernel(const float *__restrict__ qg, int64_t n, int hd, float *__restrict__ q,
                                  float *__restrict__ gate) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t head = i / hd, e = i % hd;
        q[i] = qg[2 * head * hd + e];
        gate[i] = qg[2 * head * hd + hd + e];
    }
}

__global__ void sigmoid_gate_kernel(float *x, const float *__restrict__ gate, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] /= 1.0f + expf(-gate[i]);
}

cudaError_t eic_split_gate(cudaStream_t s, const float *qg, int64_t n_tok, int64_t qd, int hd, float *q, float *gate) {
    const int64_t n = n_tok * qd;
    if (n <= 0) return cudaSuccess;
    if (hd < 1 || qd % hd) return cudaErrorInvalidValue;
    split_gate_kernel<<<ew_blocks(n), 256, 0, s>>>(qg, n, hd, q, gate);
    return cudaGetLastError();
}

cudaError_t eic_sigmoid_gate(cudaStream_t s, float *x, const float *gate, int64_t n) {
    if (n <= 0) return cudaSuccess;
    sigmoid_gate_kernel<<<ew_blocks(n), 256, 0, s>>>(x, gate, n);
    return cudaGetLastError();
}
