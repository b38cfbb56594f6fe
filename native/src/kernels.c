/* Kernel dispatch: CPU detection, the per-ISA kernel tables (filled once),
 * type geometry, fp16/bf16 helpers, row-blocked matmul and the public kernel API. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "common.h"
#include "packed.h"
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

/* ---------------- CPU detection ---------------- */

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
/* 1 when hwcaps report the ARMv8.2 dot product (vdotq_s32); EDGEINFER_NEON_DOTPROD=0 turns it off. */
static int neon_dotprod(void) {
    const char *e = getenv("EDGEINFER_NEON_DOTPROD");
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) && !(e && !strcmp(e, "0"));
}
#endif

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
    case EI_ISA_NEON: /* ASIMD is mandatory on aarch64 */
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
    else if (hw_supported(EI_ISA_NEON)) best = EI_ISA_NEON;
    const char *cap = getenv("EDGEINFER_ISA");
    if (cap && *cap) {
        int lim = -1;
        if (!strcmp(cap, "scalar")) lim = EI_ISA_SCALAR;
        else if (!strcmp(cap, "avx2")) lim = EI_ISA_AVX2;
        else if (!strcmp(cap, "avx512")) lim = EI_ISA_AVX512;
        else if (!strcmp(cap, "neon")) lim = EI_ISA_NEON;
        if (lim >= 0 && lim < best) best = lim;
    }
    cached = best;
    return best;
}

/* ---------------- type geometry ---------------- */

typedef struct {
    int block;   /* elements per block; 0: not a type we know */
    int bytes;   /* bytes per block */
    int q8a;     /* takes ei_q8a activations */
} type_info;

static const type_info TYPES[EI_TYPE_IDS] = {
    [EI_TYPE_F32] = {1, 4, 0},
    [EI_TYPE_F16] = {1, 2, 0},
    [EI_TYPE_BF16] = {1, 2, 0},
    [EI_TYPE_Q4_0] = {QK, sizeof(block_q4_0), 1},
    [EI_TYPE_Q4_1] = {QK, sizeof(block_q4_1), 1},
    [EI_TYPE_Q5_0] = {QK, sizeof(block_q5_0), 1},
    [EI_TYPE_Q5_1] = {QK, sizeof(block_q5_1), 1},
    [EI_TYPE_Q8_0] = {QK, sizeof(block_q8_0), 1},
    [EI_TYPE_Q4_K] = {QKK, sizeof(block_q4_K), 1},
    [EI_TYPE_Q5_K] = {QKK, sizeof(block_q5_K), 1},
    [EI_TYPE_Q6_K] = {QKK, sizeof(block_q6_K), 1},
    [EI_TYPE_Q2_K] = {QKK, sizeof(block_q2_K), 1},
    [EI_TYPE_Q3_K] = {QKK, sizeof(block_q3_K), 1},
    [EI_TYPE_IQ4_NL] = {QK, sizeof(block_iq4_nl), 1},
    [EI_TYPE_IQ4_XS] = {QKK, sizeof(block_iq4_xs), 1},
};

static const type_info *find_type(int type) {
    return type >= 0 && type < EI_TYPE_IDS && TYPES[type].block ? &TYPES[type] : NULL;
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

/* ---------------- kernel tables ---------------- */

/* X(type id, kernel name) for the float and the quantized weight types. */
#define FLOAT_TYPES(X) X(EI_TYPE_F32, f32) X(EI_TYPE_F16, f16) X(EI_TYPE_BF16, bf16)
#define QUANT_TYPES(X)                                                                                  \
    X(EI_TYPE_Q4_0, q4_0) X(EI_TYPE_Q4_1, q4_1) X(EI_TYPE_Q5_0, q5_0) X(EI_TYPE_Q5_1, q5_1)             \
    X(EI_TYPE_Q8_0, q8_0) X(EI_TYPE_Q4_K, q4_k) X(EI_TYPE_Q5_K, q5_k) X(EI_TYPE_Q6_K, q6_k)
/* The smaller types llama.cpp writes (Q2_K, Q3_K_S/M/L, IQ4_NL, IQ4_XS): per-row dots on their
 * GGUF layout (scalar dequantizers); AVX2 and AVX-512 pack them */
#define SMALL_TYPES(X) \
    X(EI_TYPE_Q2_K, q2_k) X(EI_TYPE_Q3_K, q3_k) X(EI_TYPE_IQ4_NL, iq4_nl) X(EI_TYPE_IQ4_XS, iq4_xs)

#define SET_DEQ(T, name, sfx) k->dequant[T] = ei_deq_##name##_##sfx;
#define SET_DOT(T, name, sfx) k->dot[T] = ei_dot_##name##_##sfx;
#define DEQ_SCALAR(T, name) SET_DEQ(T, name, scalar)
#define DOT_SCALAR(T, name) SET_DOT(T, name, scalar)

/* deltanet.h's four kernels of one ISA */
#define DELTANET(k, sfx)                                                                              \
    k->delta_step = ei_delta_step_##sfx, k->delta_chunked = ei_delta_chunked_##sfx, k->l2norm = ei_l2norm_##sfx, \
    k->gated_norm = ei_gated_norm_##sfx;

/* The references: every type, F16 and Q8_0 attention through ei_attn_pick's fallback. */
static void fill_scalar(ei_kernels *k) {
    FLOAT_TYPES(DEQ_SCALAR) QUANT_TYPES(DEQ_SCALAR) SMALL_TYPES(DEQ_SCALAR)
    FLOAT_TYPES(DOT_SCALAR) QUANT_TYPES(DOT_SCALAR) SMALL_TYPES(DOT_SCALAR)
    k->quantize_act = ei_quantize_act_scalar;
    k->swiglu = ei_swiglu_scalar;
    k->geglu = ei_geglu_scalar;
    k->conv1d = ei_conv1d_scalar;
    k->lora_up = ei_lora_up_scalar;
    DELTANET(k, scalar)
    k->to_f16 = ei_to_f16_scalar;
    k->name = "scalar";
}

#if defined(__x86_64__)
#define DEQ_AVX2(T, name) SET_DEQ(T, name, avx2)
#define DOT_AVX2(T, name) SET_DOT(T, name, avx2)
#define DOT_AVX512(T, name) SET_DOT(T, name, avx512)
#define DOT4_AVX512(T, name) k->dot4[T] = ei_dot4_##name##_avx512;
#define PACKED(T, name, sfx) k->packed[T].x1 = ei_packed_##name##_x1_##sfx, k->packed[T].x4 = ei_packed_##name##_x4_##sfx;
/* Prefill takes NW tokens a weight pass (8 on AVX2, 16 with AVX-512's 32 registers):
 * the per-block weight unpacking (scales, nibbles, 6-bit tops) is then shared by more
 * tokens */
#define PACKED_WIDE(T, name, sfx, NW)                                                                          \
    PACKED(T, name, sfx) k->packed[T].xw = ei_packed_##name##_x##NW##_##sfx, k->packed[T].xw_tok = NW;

static void fill_avx2(ei_kernels *k) {
    FLOAT_TYPES(DEQ_AVX2) QUANT_TYPES(DEQ_AVX2)
    FLOAT_TYPES(DOT_AVX2) QUANT_TYPES(DOT_AVX2) SMALL_TYPES(DOT_AVX2)
    k->quantize_act = ei_quantize_act_avx2;
    PACKED_WIDE(EI_TYPE_Q4_0, q4_0, avx2, 8) PACKED_WIDE(EI_TYPE_Q4_1, q4_1, avx2, 8)
    PACKED_WIDE(EI_TYPE_Q5_0, q5_0, avx2, 8) PACKED_WIDE(EI_TYPE_Q5_1, q5_1, avx2, 8)
    PACKED_WIDE(EI_TYPE_Q8_0, q8_0, avx2, 8)
    PACKED_WIDE(EI_TYPE_Q4_K, q4_k, avx2, 8) PACKED_WIDE(EI_TYPE_Q5_K, q5_k, avx2, 8) PACKED_WIDE(EI_TYPE_Q6_K, q6_k, avx2, 8)
    /* Decode reads two row groups a thread side by side (AMD Zen 3, against one group: 1B shape
     * Q8_0 1.20x at 1 thread, 1.08-1.19x at 2; Q4_0 1.15x, 1.05-1.40x; SmolLM2 Q4_1 1.29x,
     * 1.06x). The K-quants' far kernels did not gain (Q4_K_M 0.96x, 1.01x), nor clearly Q5_0/Q5_1's
     * (1B-shape files, 1 and 2 threads: 0.91-1.14x, within the host's noise) */
    k->packed[EI_TYPE_Q4_0].x1_far = ei_packed_q4_0_far_avx2;
    k->packed[EI_TYPE_Q4_1].x1_far = ei_packed_q4_1_far_avx2;
    k->packed[EI_TYPE_Q8_0].x1_far = ei_packed_q8_0_far_avx2;
    /* the smaller types: 1, 4 and 8 tokens a weight pass (IQ4's on Q8_0's signed path). Over 4
     * tokens a pass, the 4-token loops run at 8 tokens made Q2_K 1.07x, Q3_K 1.15x, IQ4_NL 1.11x
     * and IQ4_XS 1.09x; with the tokens inner (ei_packed_q3_k_x8_avx2, iq4_x8_block) Q3_K
     * 1.27x, IQ4_NL 1.21x, IQ4_XS 1.20x (Q2_K's so ran slower than its loop), one thread,
     * cache-resident, 64 tokens, Zen 4 capped at AVX2: scripts/bench_matvec.py --isa 1
     * --tokens 64 --sizes small */
    PACKED_WIDE(EI_TYPE_Q2_K, q2_k, avx2, 8) PACKED_WIDE(EI_TYPE_Q3_K, q3_k, avx2, 8)
    PACKED_WIDE(EI_TYPE_IQ4_NL, iq4_nl, avx2, 8) PACKED_WIDE(EI_TYPE_IQ4_XS, iq4_xs, avx2, 8)
    k->attend[0][0] = (ei_attn_kernel){ei_attend_chunk_avx2, 8, EI_ATTN_MAX_HD, 0};
    k->attend[1][0] = (ei_attn_kernel){ei_attend_chunk_q8_avx2, 32, EI_ATTN_MAX_HD, EI_ATTN_MAX_GROUP};
    k->swiglu = ei_swiglu_avx2;
    k->geglu = ei_geglu_avx2;
    k->conv1d = ei_conv1d_avx2;
    k->lora_up = ei_lora_up_avx2;
    DELTANET(k, avx2)
    k->to_f16 = ei_to_f16_f16c;
    k->name = "avx2";
}

/* AMD family 19h with AVX-512: Zen 4 (Zen 3, the same family, has no AVX-512; Zen 5 is 1Ah) */
static int amd_zen4(void) {
    unsigned a, b, c, d;
    if (!__builtin_cpu_is("amd") || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
    return ((a >> 8) & 0xf) + ((a >> 20) & 0xff) == 0x19;
}

/* AVX-512 with VNNI: the AVX2 table (its dequantizers and swiglu stay) with wider dots. */
static void fill_avx512(ei_kernels *k) {
    fill_avx2(k);
    for (int t = 0; t < EI_TYPE_IDS; t++) k->packed[t].x1_far = NULL;   /* other layouts here (row pairs) */
    FLOAT_TYPES(DOT_AVX512) QUANT_TYPES(DOT_AVX512) SMALL_TYPES(DOT_AVX512)
    QUANT_TYPES(DOT4_AVX512) SMALL_TYPES(DOT4_AVX512)
    k->quantize_act = ei_quantize_act_avx512;
    PACKED_WIDE(EI_TYPE_Q4_0, q4_0, vnni, 16) PACKED_WIDE(EI_TYPE_Q4_1, q4_1, vnni, 16)
    PACKED_WIDE(EI_TYPE_Q5_0, q5_0, vnni, 16) PACKED_WIDE(EI_TYPE_Q5_1, q5_1, vnni, 16)
    PACKED_WIDE(EI_TYPE_Q8_0, q8_0, vnni, 16)
    PACKED_WIDE(EI_TYPE_Q4_K, q4_k, vnni, 16) PACKED_WIDE(EI_TYPE_Q5_K, q5_k, vnni, 16) PACKED_WIDE(EI_TYPE_Q6_K, q6_k, vnni, 16)
    PACKED_WIDE(EI_TYPE_IQ4_NL, iq4_nl, vnni, 16) PACKED_WIDE(EI_TYPE_IQ4_XS, iq4_xs, vnni, 16)
    PACKED_WIDE(EI_TYPE_Q2_K, q2_k, vnni, 16) PACKED_WIDE(EI_TYPE_Q3_K, q3_k, vnni, 16)
#define XW2(T, name) k->packed[T].xw_2g = ei_packed_##name##_x16r16_vnni;
    XW2(EI_TYPE_Q4_0, q4_0) XW2(EI_TYPE_Q4_1, q4_1) XW2(EI_TYPE_Q5_0, q5_0) XW2(EI_TYPE_Q5_1, q5_1)
    XW2(EI_TYPE_Q8_0, q8_0) XW2(EI_TYPE_Q4_K, q4_k) XW2(EI_TYPE_Q5_K, q5_k) XW2(EI_TYPE_Q6_K, q6_k)
    XW2(EI_TYPE_IQ4_NL, iq4_nl) XW2(EI_TYPE_IQ4_XS, iq4_xs) XW2(EI_TYPE_Q2_K, q2_k) XW2(EI_TYPE_Q3_K, q3_k)
#undef XW2
    /* The 32-element-block types and Q4_K run every token count on 16-row kernels, their row
     * pairs packed unit by unit (packed.h): at one token 1.31-1.41x the 8-row kernels' rate on
     * a cache-resident matrix, the same rate streaming (AMD EPYC Zen 5, scripts/bench_matvec.py);
     * Q4_K 1.05-1.08x and the same (Zen 4; packed_k_simd.h). Q5_K and Q6_K decode on their
     * 8-row ymm kernels (kq45k_1, kq6k_1), which were the faster there. */
#define R16(T, name) k->packed[T].x1_2g = ei_packed_##name##_x1r16_vnni, k->packed[T].x4_2g = ei_packed_##name##_x4r16_vnni;
    R16(EI_TYPE_Q4_0, q4_0) R16(EI_TYPE_Q4_1, q4_1) R16(EI_TYPE_Q5_0, q5_0) R16(EI_TYPE_Q5_1, q5_1)
    R16(EI_TYPE_Q8_0, q8_0) R16(EI_TYPE_Q4_K, q4_k) R16(EI_TYPE_IQ4_NL, iq4_nl)
#undef R16
    /* Decode reads two row pairs a thread side by side on Zen 4 (1B shape, against one pair:
     * Q8_0 1.47x at 1 thread, 1.59x at 2; Q4_0 1.13x, 1.03x; docs/performance.md). Not measured
     * on other AVX-512 hosts; Q5_0/Q5_1's (0.99x, 1.06x at 1 thread) and the K-quants' (0.94x)
     * did not gain. */
    if (amd_zen4()) {
        k->packed[EI_TYPE_Q4_0].x1_far = ei_packed_q4_0_farr16_vnni;
        k->packed[EI_TYPE_Q4_1].x1_far = ei_packed_q4_1_farr16_vnni;
        k->packed[EI_TYPE_Q8_0].x1_far = ei_packed_q8_0_farr16_vnni;
        k->packed[EI_TYPE_IQ4_NL].x1_far = ei_packed_iq4_nl_farr16_vnni;   /* Q8_0's arithmetic */
        /* Q4_K's and Q6_K's one-token kernels leave the read-ahead of short rows to the hardware
         * prefetcher (packed.h, EI_HW_PF_MAX_NB): decode 1.07x / 1.05x at one thread, 1.03x /
         * 1.02x at two (1B / 3B shape Q4_K_M, the two forms by turns every 16 tokens in one
         * process). Other hosts keep the software prefetch until measured. */
        k->packed[EI_TYPE_Q4_K].x1_2g = ei_packed_q4_k_x1r16_hw_vnni;
        k->packed[EI_TYPE_Q6_K].x1 = ei_packed_q6_k_x1_hw_vnni;
    }
    k->attend[0][0] = (ei_attn_kernel){ei_attend_chunk_avx512, 16, EI_ATTN_MAX_HD, 0, ei_attend_pair_avx512};
    k->attend[0][1] = (ei_attn_kernel){ei_attend_chunk_avx2, 8, EI_ATTN_MAX_HD, 0};
    k->attend[1][0] = (ei_attn_kernel){ei_attend_chunk_q8_avx512, 32, EI_ATTN_MAX_HD, EI_ATTN_MAX_GROUP};
    k->geglu = ei_geglu_avx512;
    k->conv1d = ei_conv1d_avx512;
    DELTANET(k, avx512)
    k->name = "avx512";
}
#endif

#if defined(__aarch64__)
#define DEQ_NEON(T, name) SET_DEQ(T, name, neon)
#define DOT_NEON(T, name) SET_DOT(T, name, neon)
#define DOT_NEONDOT(T, name) SET_DOT(T, name, neondot)

/* NEON; dotprod picks the vdotq_s32 build of the integer dots. */
static void fill_neon(ei_kernels *k, int dotprod) {
    FLOAT_TYPES(DEQ_NEON) QUANT_TYPES(DEQ_NEON)
    FLOAT_TYPES(DOT_NEON)
    if (dotprod) {
        QUANT_TYPES(DOT_NEONDOT) SMALL_TYPES(DOT_NEONDOT)
    } else {
        QUANT_TYPES(DOT_NEON) SMALL_TYPES(DOT_NEON)
    }
    k->quantize_act = ei_quantize_act_neon;
    /* the K-quants are packed (packed_k_neon.c); the 32-block types keep their GGUF layout here */
#define PACKED_NEON(T, name, sfx) k->packed[T].x1 = ei_packed_##name##_x1_##sfx, k->packed[T].x4 = ei_packed_##name##_x4_##sfx;
    if (dotprod) {
        PACKED_NEON(EI_TYPE_Q4_K, q4_k, neondot) PACKED_NEON(EI_TYPE_Q5_K, q5_k, neondot)
        PACKED_NEON(EI_TYPE_Q6_K, q6_k, neondot)
    } else {
        PACKED_NEON(EI_TYPE_Q4_K, q4_k, neon) PACKED_NEON(EI_TYPE_Q5_K, q5_k, neon) PACKED_NEON(EI_TYPE_Q6_K, q6_k, neon)
    }
#undef PACKED_NEON
    k->attend[0][0] = (ei_attn_kernel){ei_attend_chunk_neon, 4, EI_ATTN_MAX_HD, 0};
    k->attend[1][0] = (ei_attn_kernel){ei_attend_chunk_q8_neon, 32, EI_ATTN_MAX_HD, 0};
    k->geglu = ei_geglu_neon;
    k->conv1d = ei_conv1d_neon;
    k->lora_up = ei_lora_up_neon;
    DELTANET(k, neon)
    k->to_f16 = ei_to_f16_neon;
    k->name = dotprod ? "neon+dotprod" : "neon";
}
#endif

void ei_kernels_fill(ei_kernels *k, int isa, int neon_dotprod) {
    memset(k, 0, sizeof *k);
    fill_scalar(k);
    switch (isa) {
#if defined(__x86_64__)
    case EI_ISA_AVX2: fill_avx2(k); break;
    case EI_ISA_AVX512: fill_avx512(k); break;
#endif
#if defined(__aarch64__)
    case EI_ISA_NEON: fill_neon(k, neon_dotprod); break;
#endif
    default: (void)neon_dotprod; break;
    }
    k->isa = isa;
}

static ei_kernels tables[EI_ISA_NEON + 1];
static int table_ok[EI_ISA_NEON + 1];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
    int dotprod = 0;
#if defined(__aarch64__)
    dotprod = neon_dotprod();
#endif
    for (int isa = EI_ISA_SCALAR; isa <= EI_ISA_NEON; isa++) {
        table_ok[isa] = hw_supported(isa);
        if (table_ok[isa]) ei_kernels_fill(&tables[isa], isa, dotprod);
    }
}

const ei_kernels *ei_kernels_get(int isa) {
    if (isa == EI_ISA_BEST) isa = ei_cpu_best_isa();
    if (isa < EI_ISA_SCALAR || isa > EI_ISA_NEON) return NULL;
    pthread_once(&tables_once, init_tables);
    return table_ok[isa] ? &tables[isa] : NULL;
}

/* ---------------- activations and row-blocked matmul ---------------- */

int64_t ei_act_stride(int64_t n_cols) { return ei_act_row_bytes(n_cols); }

void ei_quantize_act_rows(const ei_kernels *k, const float *x, int64_t n_tok, int64_t n_cols, void *out,
                          int half_sums) {
    const int64_t nb = n_cols / EI_QA_BLOCK, row_bytes = ei_act_row_bytes(n_cols);
    for (int64_t t = 0; t < n_tok; t++) {
        ei_q8a *a = (ei_q8a *)((uint8_t *)out + t * row_bytes);
        k->quantize_act(x + t * n_cols, n_cols, a);
        if (!half_sums) continue;
        int32_t *hs = (int32_t *)(a + nb);
        for (int64_t b = 0; b < nb; b++) {
            int lo = 0, hi = 0;
            for (int i = 0; i < EI_QA_BLOCK / 2; i++) lo += a[b].q[i], hi += a[b].q[EI_QA_BLOCK / 2 + i];
            hs[2 * b] = -32 * lo;
            hs[2 * b + 1] = -32 * hi;
        }
    }
}

void ei_matmul_rows(const ei_kernels *k, int type, const void *w, int64_t n_cols, int64_t r0, int64_t r1,
                    const void *act, int64_t act_stride, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t rb = ei_row_bytes(type, n_cols);
    if (rb == 0) return;
    const ei_dot_fn dot = k->dot[type];
    const ei_dot4_fn dot4 = k->dot4[type];
    const uint8_t *W = (const uint8_t *)w;
    const uint8_t *A = (const uint8_t *)act;
    /* Rows outer, tokens inner: a weight row is read from memory once and stays
     * in L1 while every token uses it. Each (row, token) value is one call of
     * the same dot function, so a token's result never depends on the batch. */
    int64_t t0 = 0;
    if (dot4) {
        /* Groups of four tokens share each expanded weight block; the rows of this
         * chunk stay in L1 while the token groups go by. */
        float out[4];
        for (; t0 + 4 <= n_tok; t0 += 4) {
            const uint8_t *a4 = A + t0 * act_stride;
            for (int64_t r = r0; r < r1; r++) {
                dot4(n_cols, W + r * rb, a4, act_stride, out);
                for (int j = 0; j < 4; j++) y[(t0 + j) * ldy + r] = out[j];
            }
        }
    }
    for (int64_t r = r0; r < r1; r++) {
        const void *row = W + r * rb;
        for (int64_t t = t0; t < n_tok; t++) y[t * ldy + r] = dot(n_cols, row, A + t * act_stride);
    }
}

/* ---------------- public kernel API ---------------- */

ei_status ei_type_block(int type, int32_t *block_elems, int32_t *block_bytes) {
    const type_info *t = find_type(type);
    if (!t) return ei_fail(EI_ERR_UNSUPPORTED, "unknown tensor type %d", type);
    if (block_elems) *block_elems = t->block;
    if (block_bytes) *block_bytes = t->bytes;
    return EI_OK;
}

static ei_status check_common(const type_info **tp, const ei_kernels **kp, int type, int isa, int64_t n,
                              const char *what) {
    const type_info *t = find_type(type);
    if (!t) return ei_fail(EI_ERR_UNSUPPORTED, "%s: unknown tensor type %d", what, type);
    if (isa != EI_ISA_BEST && (isa < EI_ISA_SCALAR || isa > EI_ISA_NEON))
        return ei_fail(EI_ERR_INVALID_ARG, "%s: unknown isa %d", what, isa);
    const ei_kernels *k = ei_kernels_get(isa);
    if (!k) return ei_fail(EI_ERR_UNSUPPORTED, "%s: isa %s is not supported on this CPU", what, ei_isa_name(isa));
    if (n < 0 || n % t->block)
        return ei_fail(EI_ERR_INVALID_ARG, "%s: n=%lld is not a non-negative multiple of the block size %d",
                       what, (long long)n, t->block);
    *tp = t;
    *kp = k;
    return EI_OK;
}

ei_status ei_kernel_dequantize(int type, int isa, const void *src, float *dst, int64_t n) {
    const type_info *t = NULL;
    const ei_kernels *k = NULL;
    ei_status st = check_common(&t, &k, type, isa, n, "dequantize");
    if (st) return st;
    if (n > 0 && (!src || !dst)) return ei_fail(EI_ERR_INVALID_ARG, "dequantize: null pointer");
    if (n > 0) k->dequant[type](src, dst, n);
    return EI_OK;
}

ei_status ei_kernel_dot(int type, int isa, int64_t n, const void *row, const float *x, float *out) {
    const type_info *t = NULL;
    const ei_kernels *k = NULL;
    ei_status st = check_common(&t, &k, type, isa, n, "dot");
    if (st) return st;
    if (!out || (n > 0 && (!row || !x))) return ei_fail(EI_ERR_INVALID_ARG, "dot: null pointer");
    if (n == 0) {
        *out = 0.0f;
        return EI_OK;
    }
    if (!t->q8a) {
        *out = k->dot[type](n, row, x);
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
    k->quantize_act(x, n, qa);
    *out = k->dot[type](n, row, qa);
    if (qa != stackbuf) free(qa);
    return EI_OK;
}
