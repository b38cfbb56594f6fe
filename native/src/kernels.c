/* Kernel dispatch: CPU detection, per-(type, ISA) tables, fp16/bf16 helpers,
 * activation quantization, row-blocked matmul and the public kernel API. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "quants_impl.h"

/* ---------------- fp16 / bf16 ---------------- */

float ei_fp16_to_fp32(uint16_t h) { return ei_h2f(h); }

uint16_t ei_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan (kept quiet, payload's top bits kept) */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below the smallest normal half (2^-14): subnormal or zero */
        if (ax < 0x33000000u) return sign; /* < 2^-25: rounds to zero (2^-25 itself ties to 0) */
        uint32_t e = ax >> 23;
        uint32_t man = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* value = man * 2^(e-150); half ulp = 2^-24 -> shift 150-24-e */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((ax >> 13) - (112u << 10)); /* rebias exponent, keep 10 mantissa bits */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

float ei_bf16_to_fp32(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* ==== NEON dispatch (issue 7; kernels in quants_neon.c) ==== */
#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
ei_dequant_fn ei_neon_get_dequant(int type);
ei_dot_fn ei_neon_get_dot(int type, int dotprod);
void ei_quantize_act_neon(const float *x, int64_t n, ei_q8a *out);
/* 1 when hwcaps report the ARMv8.2 dot product (vdotq_s32); EDGEINFER_NEON_DOTPROD=0 turns it off. */
int ei_neon_dotprod(void) {
    static volatile int cached = -1;
    int c = cached;
    if (c < 0) {
        const char *e = getenv("EDGEINFER_NEON_DOTPROD");
        c = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) && !(e && !strcmp(e, "0"));
        cached = c;
    }
    return c;
}
#endif
/* ==== end NEON dispatch ==== */

/* ---------------- CPU detection ---------------- */

static int hw_supported(int isa) {
    switch (isa) {
    case EI_ISA_SCALAR:
        return 1;
#if defined(__x86_64__)
    case EI_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    case EI_ISA_AVX512:
        __builtin_cpu_init();
        return hw_supported(EI_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#endif
#if defined(__aarch64__)
    case EI_ISA_NEON: /* NEON dispatch: ASIMD is mandatory on aarch64 */
        return 1;
#endif
    default:
        return 0;
    }
}

int ei_isa_supported(int isa) { return hw_supported(isa); }

const char *ei_isa_name(int isa) {
    switch (isa) {
    case EI_ISA_BEST: return "best";
    case EI_ISA_SCALAR: return "scalar";
    case EI_ISA_AVX2: return "avx2";
    case EI_ISA_AVX512: return "avx512";
    case EI_ISA_NEON: return "neon";
    default: return "unknown";
    }
}

int ei_cpu_best_isa(void) {
    static volatile int cached = -2;
    int c = cached;
    if (c != -2) return c;
    int best = EI_ISA_SCALAR;
    if (hw_supported(EI_ISA_AVX512)) best = EI_ISA_AVX512;
    else if (hw_supported(EI_ISA_AVX2)) best = EI_ISA_AVX2;
    else if (hw_supported(EI_ISA_NEON)) best = EI_ISA_NEON; /* NEON dispatch */
    const char *cap = getenv("EDGEINFER_ISA");
    if (cap && *cap) {
        int lim = -1;
        if (!strcmp(cap, "scalar")) lim = EI_ISA_SCALAR;
        else if (!strcmp(cap, "avx2")) lim = EI_ISA_AVX2;
        else if (!strcmp(cap, "avx512")) lim = EI_ISA_AVX512;
        else if (!strcmp(cap, "neon")) lim = EI_ISA_NEON; /* NEON dispatch */
        if (lim >= 0 && lim < best) best = lim;
    }
    cached = best;
    return best;
}

/* Resolves EI_ISA_BEST; -1 when the level cannot run here. */
static int resolve_isa(int isa) {
    if (isa == EI_ISA_BEST) return ei_cpu_best_isa();
    return hw_supported(isa) ? isa : -1;
}

/* ---------------- type geometry and tables ---------------- */

typedef struct {
    int type;
    int block;   /* elements per block */
    int bytes;   /* bytes per block */
    int q8a;     /* takes ei_q8a activations */
    ei_dequant_fn deq[3];
    ei_dot_fn dot[3];
} type_info;

#if defined(__x86_64__)
#define ROW(T, name, blk, byt, q)                                                       \
    {T, blk, byt, q, {ei_deq_##name##_scalar, ei_deq_##name##_avx2, ei_deq_##name##_avx2}, \
     {ei_dot_##name##_scalar, ei_dot_##name##_avx2, ei_dot_##name##_avx512}}
#else
#define ROW(T, name, blk, byt, q) \
    {T, blk, byt, q, {ei_deq_##name##_scalar, NULL, NULL}, {ei_dot_##name##_scalar, NULL, NULL}}
#endif

static const type_info TYPES[] = {
    ROW(EI_TYPE_F32, f32, 1, 4, 0),
    ROW(EI_TYPE_F16, f16, 1, 2, 0),
    ROW(EI_TYPE_BF16, bf16, 1, 2, 0),
    ROW(EI_TYPE_Q4_0, q4_0, QK, Q4_0_BYTES, 1),
    ROW(EI_TYPE_Q4_1, q4_1, QK, Q4_1_BYTES, 1),
    ROW(EI_TYPE_Q5_0, q5_0, QK, Q5_0_BYTES, 1),
    ROW(EI_TYPE_Q5_1, q5_1, QK, Q5_1_BYTES, 1),
    ROW(EI_TYPE_Q8_0, q8_0, QK, Q8_0_BYTES, 1),
    ROW(EI_TYPE_Q4_K, q4_k, QKK, Q4_K_BYTES, 1),
    ROW(EI_TYPE_Q5_K, q5_k, QKK, Q5_K_BYTES, 1),
    ROW(EI_TYPE_Q6_K, q6_k, QKK, Q6_K_BYTES, 1),
};

static const type_info *find_type(int type) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].type == type) return &TYPES[i];
    return NULL;
}

int ei_type_uses_q8a(int type) {
    const type_info *t = find_type(type);
    return t ? t->q8a : 0;
}

int64_t ei_row_bytes(int type, int64_t n) {
    const type_info *t = find_type(type);
    if (!t || n < 0 || n % t->block) return 0;
    return n / t->block * t->bytes;
}

ei_dequant_fn ei_get_dequant(int type, int isa) {
    const type_info *t = find_type(type);
    isa = resolve_isa(isa);
#if defined(__aarch64__)
    if (t && isa == EI_ISA_NEON) return ei_neon_get_dequant(type); /* NEON dispatch */
#endif
    if (!t || isa < 0 || isa > EI_ISA_AVX512) return NULL;
    return t->deq[isa];
}

ei_dot_fn ei_get_dot(int type, int isa) {
    const type_info *t = find_type(type);
    isa = resolve_isa(isa);
#if defined(__aarch64__)
    if (t && isa == EI_ISA_NEON) return ei_neon_get_dot(type, ei_neon_dotprod()); /* NEON dispatch */
#endif
    if (!t || isa < 0 || isa > EI_ISA_AVX512) return NULL;
    return t->dot[isa];
}

void ei_quantize_act(int isa, const float *x, int64_t n, ei_q8a *out) {
    isa = resolve_isa(isa);
#if defined(__aarch64__)
    if (isa == EI_ISA_NEON) { /* NEON dispatch */
        ei_quantize_act_neon(x, n, out);
        return;
    }
#endif
#if defined(__x86_64__)
    if (isa == EI_ISA_AVX512) {
        ei_quantize_act_avx512(x, n, out);
        return;
    }
    if (isa == EI_ISA_AVX2) {
        ei_quantize_act_avx2(x, n, out);
        return;
    }
#endif
    ei_quantize_act_scalar(x, n, out);
}

/* ---------------- row-blocked matmul ---------------- */

void ei_matmul_rows(int type, int isa, const void *w, int64_t n_cols, int64_t r0, int64_t r1,
                    const void *act, int64_t act_stride, int64_t n_tok, float *y, int64_t ldy) {
    ei_dot_fn dot = ei_get_dot(type, isa);
    if (!dot) dot = ei_get_dot(type, EI_ISA_SCALAR);
    const int64_t rb = ei_row_bytes(type, n_cols);
    if (!dot || rb == 0) return;
    const uint8_t *W = (const uint8_t *)w;
    const uint8_t *A = (const uint8_t *)act;
    /* Rows outer, tokens inner: a weight row is read from memory once and stays
     * in L1 while every token uses it. Each (row, token) value is one call of
     * the same dot function, so a token's result never depends on the batch. */
    ei_dot4_fn dot4 = ei_get_dot4(type, isa);
    int64_t t0 = 0;
    if (dot4) {
        /* Groups of four tokens share each expanded weight block; the rows of this
         * chunk stay in L1 while the token groups go by. */
        float out[4];
        for (; t0 + 4 <= n_tok; t0 += 4) {
            const uint8_t *a4 = A + t0 * act_stride;
            for (int64_t r = r0; r < r1; r++) {
                dot4(n_cols, W + r * rb, a4, act_stride, out);
                for (int k = 0; k < 4; k++) y[(t0 + k) * ldy + r] = out[k];
            }
        }
    }
    for (int64_t r = r0; r < r1; r++) {
        const void *row = W + r * rb;
        for (int64_t t = t0; t < n_tok; t++) y[t * ldy + r] = dot(n_cols, row, A + t * act_stride);
    }
}

ei_dot4_fn ei_get_dot4(int type, int isa) {
#if defined(__x86_64__)
    if (isa != EI_ISA_AVX512 || !ei_isa_supported(EI_ISA_AVX512)) return NULL;
    switch (type) {
    case EI_TYPE_Q4_0: return ei_dot4_q4_0_avx512;
    case EI_TYPE_Q4_1: return ei_dot4_q4_1_avx512;
    case EI_TYPE_Q5_0: return ei_dot4_q5_0_avx512;
    case EI_TYPE_Q5_1: return ei_dot4_q5_1_avx512;
    case EI_TYPE_Q8_0: return ei_dot4_q8_0_avx512;
    case EI_TYPE_Q4_K: return ei_dot4_q4_k_avx512;
    case EI_TYPE_Q5_K: return ei_dot4_q5_k_avx512;
    case EI_TYPE_Q6_K: return ei_dot4_q6_k_avx512;
    default: return NULL;
    }
#else
    (void)type;
    (void)isa;
    return NULL;
#endif
}

/* ---------------- public kernel API ---------------- */

ei_status ei_type_block(int type, int32_t *block_elems, int32_t *block_bytes) {
    const type_info *t = find_type(type);
    if (!t) return ei_fail(EI_ERR_UNSUPPORTED, "unknown tensor type %d", type);
    if (block_elems) *block_elems = t->block;
    if (block_bytes) *block_bytes = t->bytes;
    return EI_OK;
}

static ei_status check_common(const type_info **tp, int *isap, int type, int isa, int64_t n,
                              const char *what) {
    const type_info *t = find_type(type);
    if (!t) return ei_fail(EI_ERR_UNSUPPORTED, "%s: unknown tensor type %d", what, type);
    if (isa != EI_ISA_BEST && (isa < EI_ISA_SCALAR || isa > EI_ISA_NEON))
        return ei_fail(EI_ERR_INVALID_ARG, "%s: unknown isa %d", what, isa);
    int r = resolve_isa(isa);
    if (r < 0 || (r > EI_ISA_AVX512 && r != EI_ISA_NEON)) /* NEON dispatch: NEON allowed */
        return ei_fail(EI_ERR_UNSUPPORTED, "%s: isa %s is not supported on this CPU", what,
                       ei_isa_name(isa));
    if (n < 0 || n % t->block)
        return ei_fail(EI_ERR_INVALID_ARG, "%s: n=%lld is not a non-negative multiple of the block size %d",
                       what, (long long)n, t->block);
    *tp = t;
    *isap = r;
    return EI_OK;
}

ei_status ei_kernel_dequantize(int type, int isa, const void *src, float *dst, int64_t n) {
    const type_info *t = NULL;
    int r = 0;
    ei_status st = check_common(&t, &r, type, isa, n, "dequantize");
    if (st) return st;
    if (n > 0 && (!src || !dst)) return ei_fail(EI_ERR_INVALID_ARG, "dequantize: null pointer");
    if (n > 0) ei_get_dequant(type, r)(src, dst, n); /* via ei_get_dequant: NEON dispatch */
    return EI_OK;
}

ei_status ei_kernel_dot(int type, int isa, int64_t n, const void *row, const float *x, float *out) {
    const type_info *t = NULL;
    int r = 0;
    ei_status st = check_common(&t, &r, type, isa, n, "dot");
    if (st) return st;
    if (!out || (n > 0 && (!row || !x))) return ei_fail(EI_ERR_INVALID_ARG, "dot: null pointer");
    if (n == 0) {
        *out = 0.0f;
        return EI_OK;
    }
    if (!t->q8a) {
        *out = ei_get_dot(type, r)(n, row, x); /* NEON dispatch */
        return EI_OK;
    }
    if (n % EI_QA_BLOCK) /* cannot happen: quantized blocks are multiples of 32 */
        return ei_fail(EI_ERR_INVALID_ARG, "dot: n=%lld not a multiple of %d", (long long)n, EI_QA_BLOCK);
    ei_q8a stackbuf[64];
    ei_q8a *qa = stackbuf;
    const int64_t nb = n / EI_QA_BLOCK;
    if (nb > 64) {
        if ((uint64_t)nb > SIZE_MAX / sizeof(ei_q8a))
            return ei_fail(EI_ERR_OUT_OF_MEMORY, "dot: n=%lld too large", (long long)n);
        qa = (ei_q8a *)malloc((size_t)nb * sizeof(ei_q8a));
        if (!qa) return ei_fail(EI_ERR_OUT_OF_MEMORY, "dot: cannot allocate %lld activation blocks", (long long)nb);
    }
    ei_quantize_act(r, x, n, qa);
    *out = ei_get_dot(type, r)(n, row, qa); /* NEON dispatch */
    if (qa != stackbuf) free(qa);
    return EI_OK;
}
