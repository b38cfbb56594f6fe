/* Internal kernel interface: the per-ISA kernel table and the kernel types in it.
 * Every SIMD kernel has a scalar twin (the EI_ISA_SCALAR table) that is its oracle. */
#ifndef EI_KERNELS_H
#define EI_KERNELS_H
#include <stdint.h>
#include "edgeinfer.h"
#include "deltanet.h"

/* 8-bit activation block: x[i] ~= d * q[i]; s = d * sum(q) (for weight types with a min/offset). */
#define EI_QA_BLOCK 32
typedef struct {
    float d;
    float s;
    int8_t q[EI_QA_BLOCK];
} ei_q8a;

/* Quantized weight types take activations as ei_q8a blocks; float weight types
 * (F32, F16, BF16) take plain float activations. */
int ei_type_uses_q8a(int type);

typedef void (*ei_dequant_fn)(const void *src, float *dst, int64_t n);
/* act is const ei_q8a * or const float * depending on ei_type_uses_q8a(type). */
typedef float (*ei_dot_fn)(int64_t n, const void *row, const void *act);

/* Four tokens at once: out[t] = dot(row, act + t * act_stride) for t < 4, each
 * bit-identical to what the type's ei_dot_fn gives for that token alone. */
typedef void (*ei_dot4_fn)(int64_t n, const void *row, const void *act, int64_t act_stride, float *out);

/* n must be a multiple of EI_QA_BLOCK. */
typedef void (*ei_quantize_act_fn)(const float *x, int64_t n, ei_q8a *out);

/* Packed weights (packed.h): rows 8g..8g+7 of nb blocks times NT tokens (1, 4, or xw_tok),
 * results stored at y[t * ldy + 0..7]. */
typedef void (*ei_packed_fn)(const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y,
                             int64_t ldy);

/* One chunk of attention (attention.h, ei_attend_chunk). */
typedef void (*ei_attn_fn)(const float *q, int g, const uint8_t *k, const uint8_t *v, const int32_t *cell_pos,
                           int32_t c0, int32_t c1, int32_t n_cells, int32_t pos, int hd, float scale, float *scores, float *part);

/* The same for two tokens' queries of one slot at once (q[t], pos[t], part[t]); scores needs
 * 2 * g * (c1 - c0) floats. Each token's partial is the same bits as fn's. */
typedef void (*ei_attn_pair_fn)(const float *const q[2], int g, const uint8_t *k, const uint8_t *v,
                                const int32_t *cell_pos, int32_t c0, int32_t c1, int32_t n_cells, const int32_t pos[2],
                                int hd, float scale, float *scores, float *const part[2]);

/* An attention kernel and the head sizes and group it takes: hd a multiple of
 * hd_mult, at most hd_max; at most max_group query heads a call (0: any). pair: NULL, or its
 * two-token form (for any group). */
typedef struct {
    ei_attn_fn fn;
    int hd_mult, hd_max, max_group;
    ei_attn_pair_fn pair;
} ei_attn_kernel;

/* floats to IEEE half, round to nearest even (to_f16.c; the F16 KV cache) */
typedef void (*ei_to_f16_fn)(const float *x, int64_t n, uint16_t *out);
void ei_to_f16_scalar(const float *x, int64_t n, uint16_t *out);
#if defined(__x86_64__)
void ei_to_f16_f16c(const float *x, int64_t n, uint16_t *out);
#endif
#if defined(__aarch64__)
void ei_to_f16_neon(const float *x, int64_t n, uint16_t *out);
#endif

/* Causal depthwise conv1d with state (conv1d.c; ei_kernel_conv1d's contract, taps [K][ch]) */
enum { EI_CONV_MAX_K = 16 };
typedef void (*ei_conv1d_fn)(const float *w, int K, int64_t ch, float *state, const float *x, int64_t n_tok, float *y);
void ei_conv1d_scalar(const float *w, int K, int64_t ch, float *state, const float *x, int64_t n_tok, float *y);
#if defined(__x86_64__)
void ei_conv1d_avx2(const float *w, int K, int64_t ch, float *state, const float *x, int64_t n_tok, float *y);
void ei_conv1d_avx512(const float *w, int K, int64_t ch, float *state, const float *x, int64_t n_tok, float *y);
#endif
#if defined(__aarch64__)
void ei_conv1d_neon(const float *w, int K, int64_t ch, float *state, const float *x, int64_t n_tok, float *y);
#endif

/* gate = silu(gate) * up (swiglu.c; the scalar loop is the reference) */
typedef void (*ei_swiglu_fn)(float *gate, const float *up, int64_t n);
void ei_swiglu_scalar(float *gate, const float *up, int64_t n);
#if defined(__x86_64__)
void ei_swiglu_avx2(float *gate, const float *up, int64_t n);
#endif

/* y[i] += sum_k c[k] * bt[k * ld + i] for i < n: a LoRA update's B (transposed) times its rank-wide
 * coefficients (lora_up.c; the scalar loop is the reference) */
typedef void (*ei_lora_up_fn)(int64_t n, int rank, const float *c, const float *bt, int64_t ld, float *y);
void ei_lora_up_scalar(int64_t n, int rank, const float *c, const float *bt, int64_t ld, float *y);
#if defined(__x86_64__)
void ei_lora_up_avx2(int64_t n, int rank, const float *c, const float *bt, int64_t ld, float *y);
#endif
#if defined(__aarch64__)
void ei_lora_up_neon(int64_t n, int rank, const float *c, const float *bt, int64_t ld, float *y);
#endif

/* gate = gelu_tanh(gate) * up (geglu.c; the scalar loop is the reference) */
void ei_geglu_scalar(float *gate, const float *up, int64_t n);
#if defined(__x86_64__)
void ei_geglu_avx2(float *gate, const float *up, int64_t n);
void ei_geglu_avx512(float *gate, const float *up, int64_t n);
#endif
#if defined(__aarch64__)
void ei_geglu_neon(float *gate, const float *up, int64_t n);
#endif

/* One token over two row groups: x1's (packed, y) for each, pa/ya and pb/yb */
typedef void (*ei_packed_far_fn)(const void *pa, const void *pb, int64_t nb, const void *act, float *ya, float *yb);

#define EI_TYPE_IDS 31   /* GGML type ids index the per-type entries: 0 .. EI_TYPE_BF16 (30) */
#define EI_ATTN_CANDIDATES 2

/* Every kernel the forward calls, for one ISA level, filled once (ei_kernels_get)
 * and read through by the runtime, its thread-pool workers and the kernel API:
 * the hot paths never test the ISA. x86 (scalar, AVX2, AVX-512 + VNNI) and
 * aarch64 (NEON, with or without dotprod) fill the same fields; a NULL entry is
 * a kernel that level lacks (the caller says what happens then). */
typedef struct ei_kernels {
    int isa;             /* the level the table is for */
    const char *name;    /* "avx512", "neon+dotprod", ... */
    ei_dequant_fn dequant[EI_TYPE_IDS];
    ei_dot_fn dot[EI_TYPE_IDS];
    ei_dot4_fn dot4[EI_TYPE_IDS];   /* NULL: dot per token */
    ei_quantize_act_fn quantize_act;
    struct {
        ei_packed_fn x1, x4;        /* NULL: the type stays in its GGUF layout at this level */
        ei_packed_fn xw;            /* xw_tok tokens a weight pass (x86: K-quants; with VNNI also Q4_0-Q5_1); NULL: x4 only */
        /* xw over two row groups (16 rows, y[t * ldy + 0..15]); NULL: per group */
        ei_packed_fn xw_2g;
        /* x1 and x4 over two row groups; set (with xw_2g) only for types packed in row pairs
         * (packed.h): NULL, groups are packed and run one at a time */
        ei_packed_fn x1_2g, x4_2g;
        /* x1 over two row groups far apart (two row pairs for a type packed in pairs), block by
         * block: one thread reads two streams faster than one (AVX2 hosts and AMD Zen 4,
         * docs/performance.md); NULL: x1 a group at a time */
        ei_packed_far_fn x1_far;
        int xw_tok;
    } packed[EI_TYPE_IDS];
    /* [F16 KV, Q8_0 KV]: SIMD kernels in order of preference (fn NULL ends the
     * list); ei_attn_pick falls back to the scalar reference. */
    ei_attn_kernel attend[2][EI_ATTN_CANDIDATES];
    ei_swiglu_fn swiglu;
    ei_swiglu_fn geglu;   /* same signature: gate = gelu_tanh(gate) * up */
    ei_conv1d_fn conv1d;
    ei_lora_up_fn lora_up;
    ei_delta_fn delta_step, delta_chunked;   /* deltanet.h */
    ei_l2norm_fn l2norm;
    ei_gated_norm_fn gated_norm;
    ei_to_f16_fn to_f16;
} ei_kernels;

/* k->to_f16, for callers (and tests) that hold the table opaquely */
void ei_kernel_to_f16(const ei_kernels *k, const float *x, int64_t n, uint16_t *out);

/* The table for an ISA level (EI_ISA_BEST: the best this CPU has), initialised
 * once per process; NULL when the level cannot run here. */
const ei_kernels *ei_kernels_get(int isa);

/* Fills *k for isa (a level built for this architecture) with the NEON dotprod
 * build on or off (ignored elsewhere), whatever this CPU reports: for tests that
 * run each build. */
void ei_kernels_fill(ei_kernels *k, int isa, int neon_dotprod);

/* Bytes of one row of n elements (n a multiple of the block size), 0 if invalid. */
int64_t ei_row_bytes(int type, int64_t n);

/* Activation rows for the matmuls: a row of n_cols (a multiple of EI_QA_BLOCK) is its
 * n_cols / 32 ei_q8a blocks, then per block -32 times the sums of its two 16-quant halves
 * (int32 pairs). Kernels of types with 16-element scales (the wide Q6_K ones) start their
 * integer sums there (Q6_K's quants carry an offset of 32) instead of adding the quants up
 * again for every group of rows. */
static inline int64_t ei_act_row_bytes(int64_t n_cols) {
    /* padded to an odd number of 64-byte lines, so that the rows the prefill kernels read side
     * by side (16 tokens) start in different L1 sets: 8,192 columns make 12,288 bytes, a
     * multiple of 4 KiB, which put all 16 rows in the same sets (Q6_K 16-token tiles 1.27x
     * faster padded, AMD Zen 4, scripts/bench_matvec.py --n-cols 8192) */
    const int64_t lines = (n_cols / EI_QA_BLOCK * (int64_t)(sizeof(ei_q8a) + 2 * sizeof(int32_t)) + 63) / 64;
    return (lines | 1) * 64;
}
static inline const int32_t *ei_act_half_sums(const void *row, int64_t n_blocks) {
    return (const int32_t *)((const ei_q8a *)row + n_blocks);
}

/* ei_act_row_bytes, for callers outside C (scripts/bench_matvec.py) */
int64_t ei_act_stride(int64_t n_cols);

/* Quantizes n_tok rows of n_cols floats into activation rows (ei_act_row_bytes apart), with
 * their half sums if half_sums (the packed kernels of ei_packed_reads_half_sums's types read them). */
void ei_quantize_act_rows(const ei_kernels *k, const float *x, int64_t n_tok, int64_t n_cols, void *out,
                          int half_sums);

/* y[t * ldy + r] = dot(row r, act of token t) for r in [r0, r1), t in [0, n_tok).
 * act_stride is the byte distance between consecutive tokens' activations.
 * Rows are visited in blocks so each weight row is read once for all tokens. */
void ei_matmul_rows(const ei_kernels *k, int type, const void *w, int64_t n_cols, int64_t r0, int64_t r1,
                    const void *act, int64_t act_stride, int64_t n_tok, float *y, int64_t ldy);

/* fp16 <-> fp32 conversions (IEEE half), scalar. */
float ei_fp16_to_fp32(uint16_t h);
uint16_t ei_fp32_to_fp16(float f);
float ei_bf16_to_fp32(uint16_t h);

/* Runtime CPU detection (cpuid on x86). */
int ei_cpu_best_isa(void);
#endif
