/* Native kernel tests without Python: every SIMD kernel of this machine against
 * the scalar reference (the oracle) on random data, then a tiny end-to-end
 * forward compared with stored reference logits.
 *
 *   kernel_test [--ref FILE] [--expect-dotprod 0|1]    run the checks
 *   kernel_test --write-ref FILE                        write reference logits (scalar path)
 *
 * Paths under test (each a kernel table, kernels.h): on aarch64 the NEON table
 * with the plain-ASIMD dots and (when hwcaps report it) with the dotprod dots,
 * plus the table the run time picks; on x86-64 whichever of AVX2 / AVX-512 the
 * CPU has. Checks: dequantization and
 * packed K-quant kernels (test_packed_k),
 * activation quantization bit-exact, dot products NMSE <= 1e-6, matmul and
 * attention (F16 and Q8_0 KV) through the public API, forward logits vs the reference file (NMSE <= 1e-4, same
 * argmax) and native forward vs scalar forward on this machine.
 * Prints "N passed, M failed"; exits 1 when anything failed.
 * The kernel_test target of cmake/testing.cmake, with the shipped flags: scripts/test_aarch64.sh
 * builds it for aarch64 (static, run under qemu-aarch64); natively:
 * cmake -S . -B build/test -DEDGEINFER_TESTING=ON && cmake --build build/test --target kernel_test */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "edgeinfer.h"
#include "kernels.h"
#include "packed.h"

static int n_pass, n_fail;

static void check(int ok, const char *fmt, const char *what, const char *path, double v) {
    if (ok) {
        n_pass++;
        return;
    }
    n_fail++;
    printf("FAIL ");
    printf(fmt, what, path, v);
    printf("\n");
}

/* ---------------- deterministic random data ---------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545f4914f6cdd1dULL;
}
/* uniform in [-1, 1), a multiple of 2^-23: exact on every machine */
static float rnd_unit(void) { return (float)((int64_t)(rnd() >> 40) - (1 << 23)) / (float)(1 << 23); }

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* a random finite half: normals and subnormals, both signs */
static uint16_t rnd_half(void) {
    for (;;) {
        uint16_t h = (uint16_t)rnd();
        if (((h >> 10) & 0x1f) != 0x1f) return h;
    }
}

typedef struct {
    int type;
    const char *name;
    int block, bytes;
} tinfo;

static const tinfo TYPES[] = {
    {EI_TYPE_F32, "f32", 1, 4},        {EI_TYPE_F16, "f16", 1, 2},        {EI_TYPE_BF16, "bf16", 1, 2},
    {EI_TYPE_Q4_0, "q4_0", 32, 18},    {EI_TYPE_Q4_1, "q4_1", 32, 20},    {EI_TYPE_Q5_0, "q5_0", 32, 22},
    {EI_TYPE_Q5_1, "q5_1", 32, 24},    {EI_TYPE_Q8_0, "q8_0", 32, 34},    {EI_TYPE_Q4_K, "q4_k", 256, 144},
    {EI_TYPE_Q5_K, "q5_k", 256, 176}, {EI_TYPE_Q6_K, "q6_k", 256, 210},
    /* the smaller types: SIMD dots on the GGUF layout, scalar dequantizers (their packed x86
     * kernels are checked through ei_kernel_matmul here and in tests/test_kernels.py) */
    {EI_TYPE_Q2_K, "q2_k", 256, 84},   {EI_TYPE_Q3_K, "q3_k", 256, 110},  {EI_TYPE_IQ4_NL, "iq4_nl", 32, 18},
    {EI_TYPE_IQ4_XS, "iq4_xs", 256, 136},
};
#define N_TYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

/* Random weights of n elements: random bytes, with every scale a sane half. */
static void rnd_weights(const tinfo *t, uint8_t *w, int64_t n) {
    int64_t nb = n / t->block, bytes = nb * t->bytes;
    for (int64_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd();
    for (int64_t i = 0; i < nb; i++) {
        uint8_t *b = w + i * t->bytes;
        uint16_t s1 = ei_fp32_to_fp16(0.001f + 0.05f * fabsf(rnd_unit()));
        uint16_t s2 = ei_fp32_to_fp16(0.05f * rnd_unit());
        switch (t->type) {
        case EI_TYPE_F32: {
            float f = 4.0f * rnd_unit();
            memcpy(b, &f, 4);
            break;
        }
        case EI_TYPE_F16: put16(b, rnd_half()); break;
        case EI_TYPE_BF16: {
            /* sign, exponent 2^-17 .. 2^16 (no overflow in a dot), any mantissa */
            uint64_t r = rnd();
            put16(b, (uint16_t)(((r & 1) << 15) | ((110 + (r >> 8) % 34) << 7) | ((r >> 20) & 0x7f)));
            break;
        }
        case EI_TYPE_Q4_0: case EI_TYPE_Q5_0: case EI_TYPE_Q8_0: case EI_TYPE_IQ4_NL: case EI_TYPE_IQ4_XS:
            put16(b, s1);
            break;
        case EI_TYPE_Q4_1: case EI_TYPE_Q5_1: case EI_TYPE_Q4_K: case EI_TYPE_Q5_K:
            put16(b, s1);
            put16(b + 2, s2);
            break;
        case EI_TYPE_Q6_K: put16(b + 208, s1); break;
        case EI_TYPE_Q2_K:
            put16(b + 80, s1);
            put16(b + 82, s2);
            break;
        case EI_TYPE_Q3_K: put16(b + 108, s1); break;
        }
    }
    if (t->type == EI_TYPE_F16) /* a few special halves: zeros, smallest subnormal, largest normal */
        for (int64_t i = 0; i < n && i < 8; i++) {
            static const uint16_t sp[8] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x7bff, 0xfbff, 0x3c00};
            put16(w + 2 * i, sp[i]);
        }
}

/* Random activations with a varied dynamic range per block, some blocks zero,
 * and exact .5 ties after scaling (multiples of amax/254). */
static void rnd_act(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd_unit() * (float)(1 + (i / 32) % 7);
    if (n >= 64)
        for (int j = 32; j < 64; j++) x[j] = 0.0f;
    if (n >= 128) {
        x[96] = 127.0f;
        for (int j = 97; j < 128; j++) x[j] = (float)((int)(rnd() % 253) - 126) + 0.5f;
    }
}

static double nmse(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

/* ---------------- the kernel paths of this machine ---------------- */

typedef struct {
    const char *name;
    int isa;          /* for the public API */
    ei_kernels k;
} path;

static const ei_kernels *scalar_ref(void) { return ei_kernels_get(EI_ISA_SCALAR); }

/* 1 when the NEON table the run time picks has the dotprod dots. */
static int neon_dotprod_picked(void) {
    const ei_kernels *k = ei_kernels_get(EI_ISA_NEON);
    return k && !strcmp(k->name, "neon+dotprod");
}

static int collect_paths(path *p) {
    int n = 0;
#if defined(__aarch64__)
    p[n].name = "neon";
    p[n].isa = EI_ISA_NEON;
    ei_kernels_fill(&p[n++].k, EI_ISA_NEON, 0);
    if (neon_dotprod_picked()) {
        p[n].name = "neon+dotprod";
        p[n].isa = EI_ISA_NEON;
        ei_kernels_fill(&p[n++].k, EI_ISA_NEON, 1);
    }
#endif
    for (int isa = EI_ISA_AVX2; isa <= EI_ISA_AVX512; isa++) {
        const ei_kernels *k = ei_kernels_get(isa);
        if (k) p[n++] = (path){ei_isa_name(isa), isa, *k};
    }
#if defined(__x86_64__)
    /* The AVX-512 table with the other hosts' one-token K-quant kernels (software prefetch or
     * the hardware's: kernels.c picks by host), so that every AVX-512 host tests both. */
    if (n && p[n - 1].isa == EI_ISA_AVX512) {
        ei_kernels k = p[n - 1].k;
        const int hw = k.packed[EI_TYPE_Q6_K].x1 == ei_packed_q6_k_x1_hw_vnni;
        k.packed[EI_TYPE_Q4_K].x1_2g = hw ? ei_packed_q4_k_x1r16_vnni : ei_packed_q4_k_x1r16_hw_vnni;
        k.packed[EI_TYPE_Q6_K].x1 = hw ? ei_packed_q6_k_x1_vnni : ei_packed_q6_k_x1_hw_vnni;
        p[n++] = (path){hw ? "avx512 (sw pf)" : "avx512 (hw pf)", EI_ISA_AVX512, k};
    }
#endif
    return n;
}

static void test_quantize_act(const path *p) {
    const int64_t n = 32 * 40;
    float *x = malloc(n * sizeof(float));
    ei_q8a *a = malloc((n / 32) * sizeof(ei_q8a)), *b = malloc((n / 32) * sizeof(ei_q8a));
    for (int rep = 0; rep < 4; rep++) {
        rnd_act(x, n);
        scalar_ref()->quantize_act(x, n, a);
        p->k.quantize_act(x, n, b);
        int same = 1;
        for (int64_t i = 0; i < n / 32; i++)
            same &= a[i].d == b[i].d && a[i].s == b[i].s && !memcmp(a[i].q, b[i].q, 32);
        check(same, "%s [%s]: activation quantization differs from scalar", "quantize_act", p->name, 0);
    }
    free(x);
    free(a);
    free(b);
}

static void test_type(const tinfo *t, const path *p) {
    const int64_t sizes_q[] = {256, 512, 4096};
    const int64_t sizes_f[] = {1, 7, 64, 100, 4096};
    const int is_f = t->block == 1;
    const int64_t *sizes = is_f ? sizes_f : sizes_q;
    const int n_sizes = is_f ? 5 : 3;
    ei_dequant_fn dq_ref = scalar_ref()->dequant[t->type], dq = p->k.dequant[t->type];
    ei_dot_fn dot_ref = scalar_ref()->dot[t->type], dot = p->k.dot[t->type];
    char name[64];
    snprintf(name, sizeof name, "%s", t->name);
    check(dq != NULL && dot != NULL, "%s [%s]: kernel missing", name, p->name, 0);
    if (!dq || !dot) return;
    enum { ROWS = 16 };
    for (int si = 0; si < n_sizes; si++) {
        const int64_t n = sizes[si];
        const int64_t rb = n / t->block * t->bytes;
        uint8_t *w = malloc((size_t)(rb * ROWS));
        float *x = malloc(n * sizeof(float)), *f0 = malloc(n * sizeof(float)), *f1 = malloc(n * sizeof(float));
        ei_q8a *qa = malloc((n / 32 + 1) * sizeof(ei_q8a));
        float y0[ROWS], y1[ROWS];
        rnd_weights(t, w, n * ROWS);
        rnd_act(x, n);
        if (!is_f) scalar_ref()->quantize_act(x, n, qa);
        const void *act = is_f ? (const void *)x : (const void *)qa;
        int deq_same = 1;
        for (int r = 0; r < ROWS; r++) {
            const uint8_t *row = w + r * rb;
            dq_ref(row, f0, n);
            memset(f1, 0xa5, n * sizeof(float));
            dq(row, f1, n);
            deq_same &= !memcmp(f0, f1, n * sizeof(float));
            y0[r] = dot_ref(n, row, act);
            y1[r] = dot(n, row, act);
        }
        char what[64];
        snprintf(what, sizeof what, "%s n=%lld", t->name, (long long)n);
        check(deq_same, "%s [%s]: dequantize not bit-exact with scalar", what, p->name, 0);
        double e = nmse(y1, y0, ROWS);
        check(e <= 1e-6, "%s [%s]: dot NMSE %.3g > 1e-6", what, p->name, e);
        free(w);
        free(x);
        free(f0);
        free(f1);
        free(qa);
    }
}

/* Packed K-quants: the scalar packed reference against the unpacked scalar dot
 * (NMSE <= 1e-12: the same arithmetic, rounding apart only where a compiler
 * contracts differently), then this path's packed kernels, 1 and 4 tokens a
 * call, against the reference (NMSE <= 1e-10, the packed-kernel bound of
 * tests/test_kernels.py) and x4 (and the wide kernel, 8 or 16 tokens, where
 * present) identical to x1 per token (batch invariance); the 8-row kernels on
 * groups packed one after the other, and, where the path has 16-row kernels,
 * those on the row pair ei_pack makes of the first two groups, identical to x1. */
static void test_packed_k(const path *p) {
    static const struct {
        int type;
        const char *name;
        ei_packed_fn ref;
    } KT[] = {{EI_TYPE_Q4_K, "q4_k", ei_packed_q4_k_ref},
              {EI_TYPE_Q5_K, "q5_k", ei_packed_q5_k_ref},
              {EI_TYPE_Q6_K, "q6_k", ei_packed_q6_k_ref}};
    const int64_t sizes[] = {256, 768, 2304};
    enum { ROWS = 24, NT = 16 };
    for (int ti = 0; ti < 3; ti++) {
        const tinfo *t = NULL;
        for (int i = 0; i < N_TYPES; i++)
            if (TYPES[i].type == KT[ti].type) t = &TYPES[i];
        const ei_kernels *k = &p->k;
        if (!k->packed[t->type].x1) {
            printf("  %-14s packed %s: none at this level\n", p->name, t->name);
            continue;
        }
        for (int si = 0; si < 3; si++) {
            const int64_t n = sizes[si], nb = n / 256, rb = nb * t->bytes;
            const size_t pb = ei_packed_bytes(k, t->type, ROWS, n);
            uint8_t *w = malloc((size_t)(rb * ROWS)), *pk = malloc(pb), *pairs = malloc(pb);
            float *x = malloc(NT * n * sizeof(float));
            const int64_t st = ei_act_row_bytes(n);   /* activation rows as the runtime makes them */
            uint8_t *qa = calloc(NT, (size_t)st);
            float y0[NT * ROWS], yr[NT * ROWS], y1[NT * ROWS], y4[NT * ROWS], yw[NT * ROWS];
            float z1[NT * ROWS], z4[NT * ROWS], zw[NT * ROWS];
            rnd_weights(t, w, n * ROWS);
            rnd_act(x, NT * n);
            ei_quantize_act_rows(scalar_ref(), x, NT, n, qa, 1);
            ei_pack_k(t->type, w, ROWS, n, 0, pk);
            ei_pack(k, t->type, w, ROWS, n, pairs);
            const int64_t gb = (int64_t)pb / (ROWS / 8);
            for (int tok = 0; tok < NT; tok++)
                for (int r = 0; r < ROWS; r++) y0[tok * ROWS + r] = scalar_ref()->dot[t->type](n, w + r * rb, qa + tok * st);
            for (int g = 0; g < ROWS / 8; g++) {
                for (int tok = 0; tok < NT; tok++) {
                    KT[ti].ref(pk + g * gb, nb, qa + tok * st, st, yr + tok * ROWS + 8 * g, ROWS);
                    k->packed[t->type].x1(pk + g * gb, nb, qa + tok * st, st, y1 + tok * ROWS + 8 * g, ROWS);
                }
                for (int tok = 0; tok < NT; tok += 4)
                    k->packed[t->type].x4(pk + g * gb, nb, qa + tok * st, st, y4 + tok * ROWS + 8 * g, ROWS);
                const int nw = k->packed[t->type].xw_tok;
                for (int tok = 0; k->packed[t->type].xw && tok < NT; tok += nw)
                    k->packed[t->type].xw(pk + g * gb, nb, qa + tok * st, st, yw + tok * ROWS + 8 * g, ROWS);
            }
            char what[64];
            snprintf(what, sizeof what, "packed %s n=%lld", t->name, (long long)n);
            if (k->packed[t->type].x1_2g) {   /* rows 0..15 */
                for (int tok = 0; tok < NT; tok++)
                    k->packed[t->type].x1_2g(pairs, nb, qa + tok * st, st, z1 + tok * ROWS, ROWS);
                for (int tok = 0; tok < NT; tok += 4)
                    k->packed[t->type].x4_2g(pairs, nb, qa + tok * st, st, z4 + tok * ROWS, ROWS);
                k->packed[t->type].xw_2g(pairs, nb, qa, st, zw, ROWS);
                int same = 1;
                for (int tok = 0; tok < NT; tok++)
                    same &= !memcmp(z1 + tok * ROWS, y1 + tok * ROWS, 16 * sizeof(float)) &&
                            !memcmp(z4 + tok * ROWS, y1 + tok * ROWS, 16 * sizeof(float)) &&
                            !memcmp(zw + tok * ROWS, y1 + tok * ROWS, 16 * sizeof(float));
                check(same, "%s [%s]: the row pair's 16-row kernels differ from x1", what, p->name, 0);
            }
            double e = nmse(yr, y0, NT * ROWS);
            check(e <= 1e-12, "%s [%s]: scalar packed reference vs unpacked dot NMSE %.3g", what, p->name, e);
            e = nmse(y1, yr, NT * ROWS);
            check(e <= 1e-10, "%s [%s]: x1 vs scalar packed reference NMSE %.3g", what, p->name, e);
            check(!memcmp(y1, y4, sizeof y1), "%s [%s]: x4 differs from x1 (%g)", what, p->name, 0);
            if (k->packed[t->type].xw)
                check(!memcmp(y1, yw, sizeof y1), "%s [%s]: x%d differs from x1", what, p->name, k->packed[t->type].xw_tok);
            free(w);
            free(pk);
            free(pairs);
            free(x);
            free(qa);
        }
    }
}

/* Public API: ei_kernel_dequantize / ei_kernel_dot / ei_kernel_matmul at this ISA vs scalar. */
static void test_public_api(int isa, const char *pname) {
    for (int ti = 0; ti < N_TYPES; ti++) {
        const tinfo *t = &TYPES[ti];
        const int64_t n = 512, rows = 40, rb = n / t->block * t->bytes;
        uint8_t *w = malloc((size_t)(rb * rows));
        float *x = malloc(3 * n * sizeof(float)), *d0 = malloc(n * sizeof(float)), *d1 = malloc(n * sizeof(float));
        float *y0 = malloc(3 * rows * sizeof(float)), *y1 = malloc(3 * rows * sizeof(float));
        rnd_weights(t, w, n * rows);
        rnd_act(x, 3 * n);
        char what[64];
        snprintf(what, sizeof what, "api %s", t->name);
        int ok = ei_kernel_dequantize(t->type, EI_ISA_SCALAR, w, d0, n) == EI_OK &&
                 ei_kernel_dequantize(t->type, isa, w, d1, n) == EI_OK && !memcmp(d0, d1, n * sizeof(float));
        check(ok, "%s [%s]: ei_kernel_dequantize mismatch or error", what, pname, 0);
        float a = 0, b = 0;
        ok = ei_kernel_dot(t->type, EI_ISA_SCALAR, n, w, x, &a) == EI_OK &&
             ei_kernel_dot(t->type, isa, n, w, x, &b) == EI_OK;
        double e = ok ? nmse(&b, &a, 1) : INFINITY;
        check(e <= 1e-6, "%s [%s]: ei_kernel_dot NMSE %.3g", what, pname, e);
        ok = ei_kernel_matmul(t->type, EI_ISA_SCALAR, w, rows, n, x, 3, y0, 1) == EI_OK &&
             ei_kernel_matmul(t->type, isa, w, rows, n, x, 3, y1, 2) == EI_OK;
        e = ok ? nmse(y1, y0, 3 * rows) : INFINITY;
        check(e <= 1e-6, "%s [%s]: ei_kernel_matmul NMSE %.3g", what, pname, e);
        free(w);
        free(x);
        free(d0);
        free(d1);
        free(y0);
        free(y1);
    }
}

/* ei_kernel_attention at this ISA vs scalar: F16 and Q8_0 K/V rows, empty and future cells
 * masked, several chunks; NMSE <= 1e-10 (F16) and 1e-8 (Q8_0: a weight may round apart). */
static void test_attention(int isa, const char *pname) {
    /* the last two: Gemma 4's full-layer heads (512), and 384 */
    static const int shapes[][3] = {{300, 64, 3}, {7, 128, 2}, {520, 32, 1}, {90, 48, 1}, {257, 16, 4}, {300, 512, 2}, {40, 384, 3}};
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
        const int n = shapes[si][0], hd = shapes[si][1], g = shapes[si][2];
        for (int kv = 0; kv < 2; kv++) {
            const int type = kv ? EI_TYPE_Q8_0 : EI_TYPE_F16;
            if (type == EI_TYPE_Q8_0 && hd % 32) continue;
            const size_t rb = (size_t)ei_row_bytes(type, hd);
            uint8_t *k = malloc(rb * n), *v = malloc(rb * n);
            float *q = malloc(sizeof(float) * g * hd), *row = malloc(sizeof(float) * hd);
            float *o0 = malloc(sizeof(float) * g * hd), *o1 = malloc(sizeof(float) * g * hd);
            int32_t *cp = malloc(sizeof(int32_t) * n);
            for (int i = 0; i < g * hd; i++) q[i] = 2.0f * rnd_unit();
            for (int c = 0; c < n; c++) {
                for (int h = 0; h < 2; h++) {
                    for (int i = 0; i < hd; i++) row[i] = rnd_unit();
                    ei_kv_store_row(scalar_ref(), type, row, hd, (h ? v : k) + rb * c);   /* as the runtime stores them */
                }
                cp[c] = rnd() % 10 == 0 ? -1 : c;   /* some empty cells */
            }
            const int pos = n - 1 - n / 5;           /* later cells are in the future */
            char what[64];
            snprintf(what, sizeof what, "attention %s n=%d hd=%d g=%d", kv ? "q8_0" : "f16", n, hd, g);
            int ok = ei_kernel_attention(EI_ISA_SCALAR, q, g, k, v, type, cp, n, pos, hd, o0) == EI_OK &&
                     ei_kernel_attention(isa, q, g, k, v, type, cp, n, pos, hd, o1) == EI_OK;
            const double e = ok ? nmse(o1, o0, g * hd) : INFINITY;
            check(e <= (kv ? 1e-8 : 1e-10), "%s [%s]: NMSE %.3g vs scalar", what, pname, e);
            if (hd > 256) {
                /* the kernel ei_kernel_attention (and the runtime) picks for this head size is not the
                 * fallback the scalar table gets */
                check(ei_attn_pick(ei_kernels_get(isa), type, hd).fn != ei_attn_pick(scalar_ref(), type, hd).fn,
                      "%s [%s]: the scalar fallback ran", what, pname, 0);
                /* F16: a SIMD kernel sums in another order, so identical bits mean the fallback ran. Not
                 * for Q8_0: its NEON kernel is the reference's integer algorithm, only exp() apart, and
                 * can match every bit on some data */
                if (!kv)
                    check(ok && memcmp(o0, o1, sizeof(float) * g * hd) != 0, "%s [%s]: identical bits to the scalar fallback",
                          what, pname, 0);
            }
            free(k);
            free(v);
            free(q);
            free(row);
            free(o0);
            free(o1);
            free(cp);
        }
    }
}

/* The Gated DeltaNet kernels at this ISA vs scalar (deltanet.c): the delta rule token by token
 * and by chunks of 16 and 64 (tiled value heads, dv not a vector multiple), L2 norm, gated RMSNorm. */
static void test_deltanet(int isa, const char *pname) {
    enum { N = 70, NHV = 4, NHK = 2, DK = 32, DV = 20 };
    static float q[N * NHK * DK], k[N * NHK * DK], v[N * NHV * DV], g[N * NHV], b[N * NHV];
    static float s0[NHV * DK * DV], s1[NHV * DK * DV], o0[N * NHV * DV], o1[N * NHV * DV];
    for (int i = 0; i < N * NHK * DK; i++) q[i] = rnd_unit() * 0.2f, k[i] = rnd_unit() * 0.2f;
    for (int i = 0; i < N * NHV * DV; i++) v[i] = rnd_unit();
    for (int i = 0; i < N * NHV; i++) g[i] = -0.3f * (rnd_unit() + 1.0f), b[i] = 0.5f + 0.4f * rnd_unit();
    static const int chunks[] = {0, 16, 64};
    for (int ci = 0; ci < 3; ci++) {
        for (int i = 0; i < NHV * DK * DV; i++) s0[i] = s1[i] = 0.1f * rnd_unit();
        int ok = ei_kernel_delta_rule(EI_ISA_SCALAR, chunks[ci], q, k, v, g, b, N, NHV, NHK, DK, DV, s0, o0) == EI_OK &&
                 ei_kernel_delta_rule(isa, chunks[ci], q, k, v, g, b, N, NHV, NHK, DK, DV, s1, o1) == EI_OK;
        double e = ok ? nmse(o1, o0, N * NHV * DV) + nmse(s1, s0, NHV * DK * DV) : INFINITY;
        char what[48];
        snprintf(what, sizeof what, "delta rule chunk %d", chunks[ci]);
        check(e <= 1e-10, "%s [%s]: NMSE %.3g vs scalar", what, pname, e);
    }
    memcpy(o1, v, sizeof(float) * N * NHV * DV);
    memcpy(o0, v, sizeof(float) * N * NHV * DV);
    int ok = ei_kernel_l2norm(EI_ISA_SCALAR, o0, N * NHV, DV, 1e-6f, 0.5f) == EI_OK &&
             ei_kernel_l2norm(isa, o1, N * NHV, DV, 1e-6f, 0.5f) == EI_OK;
    check(ok && nmse(o1, o0, N * NHV * DV) <= 1e-12, "%s [%s]: NMSE %.3g vs scalar", "l2norm", pname, nmse(o1, o0, N * NHV * DV));
    ok = ei_kernel_gated_rms_norm(EI_ISA_SCALAR, o0, q, v, N * NHV, DV, 1e-6f) == EI_OK &&
         ei_kernel_gated_rms_norm(isa, o1, q, v, N * NHV, DV, 1e-6f) == EI_OK;
    check(ok && nmse(o1, o0, N * NHV * DV) <= 1e-10, "%s [%s]: NMSE %.3g vs scalar", "gated rms norm", pname,
          nmse(o1, o0, N * NHV * DV));
}

/* ---------------- tiny end-to-end forward ---------------- */

enum { L_N = 2, D = 64, NH = 4, NKV = 2, HD = 16, FF = 128, VOCAB = 96 };

typedef struct {
    void *bufs[64];
    int n;
} arena;

static void *keep(arena *a, void *p) { return a->bufs[a->n++] = p; }

/* Weight values from integers only (exact on every machine). */
static void *make_weight(arena *ar, int type, int64_t ne0, int64_t ne1) {
    const int64_t n = ne0 * ne1;
    int64_t bytes = ei_row_bytes(type, ne0) * ne1;
    uint8_t *w = keep(ar, calloc(1, (size_t)bytes));
    const float scale = 1.0f / (float)(ne0 >= 128 ? 512 : 256); /* ~ 1/sqrt(fan_in) / 4 */
    if (type == EI_TYPE_F32) {
        float *f = (float *)w;
        for (int64_t i = 0; i < n; i++) f[i] = (float)((int)(rnd() % 17) - 8) * scale;
    } else if (type == EI_TYPE_F16) {
        for (int64_t i = 0; i < n; i++) put16(w + 2 * i, ei_fp32_to_fp16((float)((int)(rnd() % 33) - 16) * scale * 0.5f));
    } else if (type == EI_TYPE_Q8_0) {
        for (int64_t b = 0; b < n / 32; b++) {
            uint8_t *blk = w + 34 * b;
            put16(blk, ei_fp32_to_fp16(scale * (float)(1 + rnd() % 4) / 16.0f));
            for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)((int)(rnd() % 255) - 127);
        }
    } else if (type == EI_TYPE_Q4_0) {
        for (int64_t b = 0; b < n / 32; b++) {
            uint8_t *blk = w + 18 * b;
            put16(blk, ei_fp32_to_fp16(scale * (float)(1 + rnd() % 4) / 2.0f));
            for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)rnd();
        }
    }
    return w;
}

static void *make_norm(arena *ar, int64_t n) {
    float *f = keep(ar, malloc(n * sizeof(float)));
    for (int64_t i = 0; i < n; i++) f[i] = 1.0f + (float)((int)(rnd() % 9) - 4) / 32.0f;
    return f;
}

#define E2E_ROWS 3
/* Runs the fixed scenario at `isa`; writes E2E_ROWS x VOCAB logits. */
static int run_forward(int isa, float *logits) {
    rng_state = 0x1234567887654321ULL; /* same model whatever ran before */
    ei_model_config cfg = {.n_layer = L_N, .n_embd = D, .n_head = NH, .n_head_kv = NKV,
                           .head_dim = HD, .n_ff = FF, .n_vocab = VOCAB, .rope_dim = HD, .rope_neox = 0,
                           .rope_theta = 10000.0f, .rope_freq_scale = 1.0f, .rms_eps = 1e-5f};
    ei_model *m = NULL;
    arena ar = {.n = 0};
    int ok = ei_model_create(&cfg, &m) == EI_OK;
#define SET(layer, role, data, type, ne0, ne1) ok = ok && ei_model_set_tensor(m, layer, role, data, type, ne0, ne1) == EI_OK
    SET(-1, EI_T_TOKEN_EMBD, make_weight(&ar, EI_TYPE_F16, D, VOCAB), EI_TYPE_F16, D, VOCAB);
    SET(-1, EI_T_OUTPUT_NORM, make_norm(&ar, D), EI_TYPE_F32, D, 1);
    SET(-1, EI_T_OUTPUT, make_weight(&ar, EI_TYPE_Q8_0, D, VOCAB), EI_TYPE_Q8_0, D, VOCAB);
    for (int l = 0; l < L_N; l++) {
        SET(l, EI_T_ATTN_NORM, make_norm(&ar, D), EI_TYPE_F32, D, 1);
        SET(l, EI_T_ATTN_Q, make_weight(&ar, EI_TYPE_Q4_0, D, NH * HD), EI_TYPE_Q4_0, D, NH * HD);
        SET(l, EI_T_ATTN_K, make_weight(&ar, EI_TYPE_Q8_0, D, NKV * HD), EI_TYPE_Q8_0, D, NKV * HD);
        SET(l, EI_T_ATTN_V, make_weight(&ar, EI_TYPE_F16, D, NKV * HD), EI_TYPE_F16, D, NKV * HD);
        SET(l, EI_T_ATTN_OUTPUT, make_weight(&ar, EI_TYPE_Q4_0, NH * HD, D), EI_TYPE_Q4_0, NH * HD, D);
        SET(l, EI_T_FFN_NORM, make_norm(&ar, D), EI_TYPE_F32, D, 1);
        SET(l, EI_T_FFN_GATE, make_weight(&ar, EI_TYPE_Q8_0, D, FF), EI_TYPE_Q8_0, D, FF);
        SET(l, EI_T_FFN_UP, make_weight(&ar, EI_TYPE_Q4_0, D, FF), EI_TYPE_Q4_0, D, FF);
        SET(l, EI_T_FFN_DOWN, make_weight(&ar, EI_TYPE_Q8_0, FF, D), EI_TYPE_Q8_0, FF, D);
    }
#undef SET
    ok = ok && ei_model_finalize(m) == EI_OK;
    ei_runtime *rt = NULL;
    ei_runtime_params prm = {.n_threads = 2, .n_slots = 2, .n_ctx = 16, .n_sink = 0, .max_batch = 16,
                             .kv_type = EI_TYPE_F16, .isa = isa};
    ok = ok && ei_runtime_create(m, &prm, &rt) == EI_OK;
    /* step 1: slot 0 prefills 6 tokens, slot 1 prefills 4, in one batch */
    int32_t tok[10] = {1, 17, 42, 5, 88, 23, 9, 64, 31, 70};
    int32_t slots[10] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 1};
    int32_t pos[10] = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3};
    int32_t rows1[2] = {5, 9};
    ok = ok && ei_forward(rt, 10, tok, slots, pos, pos, 2, rows1, logits, 0, NULL) == EI_OK;
    /* step 2: one decode token for slot 0 */
    int32_t t2 = 50, s2 = 0, p2 = 6, r2 = 0;
    ok = ok && ei_forward(rt, 1, &t2, &s2, &p2, &p2, 1, &r2, logits + 2 * VOCAB, 0, NULL) == EI_OK;
    if (!ok) printf("forward at isa %s failed: %s\n", ei_isa_name(isa), ei_last_error());
    ei_runtime_free(rt);
    ei_model_free(m);
    for (int i = 0; i < ar.n; i++) free(ar.bufs[i]);
    return ok;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void compare_logits(const float *got, const float *ref, const char *what) {
    double e = nmse(got, ref, E2E_ROWS * VOCAB);
    check(e <= 1e-4, "%s [%s]: logits NMSE %.3g > 1e-4", what, "forward", e);
    int same = 1;
    for (int r = 0; r < E2E_ROWS; r++) same &= argmax(got + r * VOCAB, VOCAB) == argmax(ref + r * VOCAB, VOCAB);
    check(same, "%s [%s]: argmax differs", what, "forward", 0);
    printf("  %-34s NMSE %.3g\n", what, e);
}

static int write_ref(const char *path) {
    static float lg[E2E_ROWS * VOCAB];
    if (!run_forward(EI_ISA_SCALAR, lg)) return 1;
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "# edgeinfer native/tests/kernel_test.c reference logits (scalar path, %d rows x %d)\n", E2E_ROWS, VOCAB);
    fprintf(f, "# regenerate: kernel_test --write-ref native/tests/forward_ref.txt (on x86-64)\n");
    for (int i = 0; i < E2E_ROWS * VOCAB; i++) fprintf(f, "%.9g\n", lg[i]);
    fclose(f);
    printf("wrote %s\n", path);
    return 0;
}

static int read_ref(const char *path, float *out) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    int k = 0;
    while (fgets(line, sizeof line, f) && k < E2E_ROWS * VOCAB) {
        if (line[0] == '#' || line[0] == '\n') continue;
        out[k++] = strtof(line, NULL);
    }
    fclose(f);
    return k == E2E_ROWS * VOCAB;
}

static void test_forward(const char *ref_path) {
    static float scalar[E2E_ROWS * VOCAB], best[E2E_ROWS * VOCAB], ref[E2E_ROWS * VOCAB];
    int ok = run_forward(EI_ISA_SCALAR, scalar) && run_forward(EI_ISA_BEST, best);
    check(ok, "%s [%s]: forward failed", "e2e", "forward", 0);
    if (!ok) return;
    char what[64];
    snprintf(what, sizeof what, "%s vs scalar (this machine)", ei_isa_name(ei_cpu_best_isa()));
    compare_logits(best, scalar, what);
    if (ref_path) {
        int have = read_ref(ref_path, ref);
        check(have, "%s [%s]: cannot read reference logits %s", "e2e", "forward", 0);
        if (have) {
            compare_logits(scalar, ref, "scalar vs stored reference");
            snprintf(what, sizeof what, "%s vs stored reference", ei_isa_name(ei_cpu_best_isa()));
            compare_logits(best, ref, what);
        }
    }
}

/* The gated activations (swiglu, geglu): each path's kernel against the scalar loop,
 * on lengths that leave a SIMD tail. */
static void test_activations(const path *p) {
    const int64_t sizes[] = {7, 64, 1000};
    const struct {
        const char *name;
        ei_swiglu_fn got, ref;
    } acts[] = {{"swiglu", p->k.swiglu, scalar_ref()->swiglu}, {"geglu", p->k.geglu, scalar_ref()->geglu}};
    for (int a = 0; a < 2; a++) {
        check(acts[a].got != NULL, "%s [%s]: kernel missing", acts[a].name, p->name, 0);
        if (!acts[a].got) continue;
        for (int si = 0; si < 3; si++) {
            const int64_t n = sizes[si];
            float *g = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float)), *up = malloc(n * sizeof(float));
            for (int64_t i = 0; i < n; i++) {
                g[i] = ref[i] = 8 * rnd_unit();
                up[i] = 2 * rnd_unit();
            }
            acts[a].ref(ref, up, n);
            acts[a].got(g, up, n);
            const double e = nmse(g, ref, n);
            check(e <= 1e-10, "%s [%s]: NMSE %.3g vs scalar", acts[a].name, p->name, e);
            free(g);
            free(ref);
            free(up);
        }
    }
}

/* LoRA's up projection (lora_up.c): each path's kernel against the scalar loop, on widths that leave
 * a SIMD tail, only columns [0, n) of a wider B^T, nothing past n written. */
static void test_lora_up(const path *p) {
    enum { R = 9, LD = 150 };
    const int64_t sizes[] = {1, 15, 33, 143};
    check(p->k.lora_up != NULL, "%s [%s]: kernel missing", "lora_up", p->name, 0);
    if (!p->k.lora_up) return;
    float bt[R * LD], c[R], got[LD], ref[LD];
    for (int i = 0; i < R * LD; i++) bt[i] = rnd_unit();
    for (int i = 0; i < R; i++) c[i] = 2 * rnd_unit();
    for (int si = 0; si < 4; si++) {
        const int64_t n = sizes[si];
        for (int i = 0; i < LD; i++) got[i] = ref[i] = rnd_unit();
        scalar_ref()->lora_up(n, R, c, bt, LD, ref);
        p->k.lora_up(n, R, c, bt, LD, got);
        const double e = nmse(got, ref, n);
        check(e <= 1e-10, "%s [%s]: NMSE %.3g vs scalar", "lora_up", p->name, e);
        check(!memcmp(got + n, ref + n, (LD - n) * sizeof(float)), "%s [%s]: wrote past n", "lora_up", p->name, 0);
    }
}

/* The F16 KV rows: each path's converter against the scalar one, bit for bit (specials,
 * ties, a NaN with a payload), on a length that leaves a SIMD tail. */
static void test_to_f16(const path *p) {
    enum { N = 1003 };
    float x[N];
    uint16_t got[N], want[N];
    const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00123u, 0x7f812345u, 0x477ff000u, 0x33000000u,
                                 0x33000001u, 0x387fe000u, 0x00000001u, 0x80000000u};
    for (int i = 0; i < N; i++) x[i] = 70000 * rnd_unit() * rnd_unit() * rnd_unit();
    for (int i = 0; i < (int)(sizeof specials / sizeof specials[0]); i++) memcpy(&x[3 * i], &specials[i], 4);
    scalar_ref()->to_f16(x, N, want);
    p->k.to_f16(x, N, got);
    check(!memcmp(got, want, sizeof got), "%s [%s]: differs from the scalar conversion", "to_f16", p->name, 0);
}

int main(int argc, char **argv) {
    const char *ref = NULL;
    int expect_dp = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--write-ref") && i + 1 < argc) return write_ref(argv[i + 1]);
        if (!strcmp(argv[i], "--ref") && i + 1 < argc) ref = argv[++i];
        else if (!strcmp(argv[i], "--expect-dotprod") && i + 1 < argc) expect_dp = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--ref FILE] [--expect-dotprod 0|1] | --write-ref FILE\n", argv[0]);
            return 2;
        }
    }
    static path paths[4];
    const int np = collect_paths(paths);
    printf("best isa: %s; paths under test:", ei_isa_name(ei_cpu_best_isa()));
    for (int i = 0; i < np; i++) printf(" %s", paths[i].name);
    printf("\n");
#if defined(__aarch64__)
    check(ei_cpu_best_isa() == EI_ISA_NEON, "%s [%s]: best isa is not neon", "dispatch", "neon", 0);
    const int dp = neon_dotprod_picked();
    if (expect_dp >= 0)
        check(dp == expect_dp, "%s [%s]: hwcaps dotprod = %.0f, not as expected", "dispatch", "neon", (double)dp);
    /* the table the run time uses has the dot build hwcaps call for, and the two builds differ */
    const ei_kernels *best = ei_kernels_get(EI_ISA_BEST);
    const ei_kernels *want = &paths[dp ? 1 : 0].k, *other = &paths[0].k;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int t = TYPES[ti].type, quant = TYPES[ti].block > 1;
        check(best->dot[t] == want->dot[t] && best->dequant[t] == want->dequant[t] &&
                  (!dp || !quant || want->dot[t] != other->dot[t]),
              "%s [%s]: dispatch picked another kernel", TYPES[ti].name, "neon", 0);
    }
#else
    (void)expect_dp;
#endif
    for (int pi = 0; pi < np; pi++) {
        rng_state = 0x9e3779b97f4a7c15ULL;
        test_quantize_act(&paths[pi]);
        test_activations(&paths[pi]);
        test_lora_up(&paths[pi]);
        test_to_f16(&paths[pi]);
        for (int ti = 0; ti < N_TYPES; ti++) test_type(&TYPES[ti], &paths[pi]);
        int before = n_fail;
        test_packed_k(&paths[pi]);
        if (!pi || paths[pi].isa != paths[pi - 1].isa) {   /* these run the ISA's own table */
            test_public_api(paths[pi].isa, paths[pi].name);
            test_attention(paths[pi].isa, paths[pi].name);
            test_deltanet(paths[pi].isa, paths[pi].name);
        }
        printf("  %-14s kernels: %s\n", paths[pi].name, n_fail == before ? "ok" : "FAILED");
    }
    test_forward(ref);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
