/* What another activation format would buy the Q4_K prefill kernel on a host where vpdpbusd
 * shares its pipes with float multiplies (AMD Zen 4; docs/performance.md, "Why the prefill stays
 * under 2x here"). One thread, 16 rows x 16 tokens, cache-resident, best of 5 interleaved passes:
 *
 *   A  the shipped kernel (ei_packed_q4_k_x16r16_vnni, over a row pair): activations in
 *      32-element blocks, each with its own scale, so every token and sub-block costs three
 *      float multiplies;
 *   B  a prototype over activations with one scale per 256 elements (llama.cpp's Q8_K): the
 *      row's sub-block scales multiply the integer sums once per sub-block, the mins' sum is an
 *      integer dot (vpdpwssd) and the token's scale is applied once per super-block.
 *
 * and at one token (decode), 512 rows, cache-resident: A1, the 8-row kernel
 * (ei_packed_q4_k_x1_vnni), against B1, its scheme over B's format.
 *
 * B and B1 are checked against a float64 sum of their format (their bits are not the shipped
 * kernels', so they are measurements, not kernels). Multiply-adds a second count the int8
 * products.
 *
 *   gcc -O3 -DNDEBUG -DEI_VERSION='"bench"' -Inative/src -Inative/include \
 *       scripts/bench_q8k_activation.c native/src/*.c -o /tmp/bench_q8k_activation -lm -lpthread
 *   /tmp/bench_q8k_activation            (x86-64 with AVX-512 VNNI only)
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blocks.h"
#include "edgeinfer.h"
#include "kernels.h"
#include "packed.h"
#include "packed_zmm.h"
#include "quants_impl.h"

enum { ROWS = 16, TOKENS = 16, NB = 8, PASSES = 5, CALLS = 40000 };

void ei_packed_q4_k_x16r16_vnni(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy);
void ei_packed_q4_k_x1_vnni(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy);

typedef struct {   /* 256 activations with one scale, and each 32's sum of quants */
    float d;
    int16_t bsum[8];
    int8_t q[QKK];
} q8k;

static uint8_t packed[ROWS / EI_PACK_ROWS * NB * EI_PK_Q4K_BYTES] __attribute__((aligned(64)));
static uint8_t packed_pair[sizeof packed] __attribute__((aligned(64)));   /* A's row pair */
static ei_q8a act32[TOKENS][NB * 8];
static q8k act256[TOKENS][NB];
static float y_a[TOKENS][ROWS], y_b[TOKENS][ROWS];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The low and high nibbles of 8 x 32 bytes of each group at qp (a nibble pair: two sub-blocks'
 * 4-bit quants, packed.h), as bytes */
ZINL void znibbles8(const uint8_t *qp, size_t gs, __m512i lo[8], __m512i hi[8]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int k = 0; k < 8; k++) {
        const __m512i v = zld2(qp + 32 * k, gs);
        lo[k] = _mm512_and_si512(v, m4);
        hi[k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
}

/* 8 u8 of each group (8 rows' sub-block scales or mins) as 16 floats / 16 int32 */
ZINL __m512i zu8i(const uint8_t *p, size_t gs) { return _mm512_cvtepu8_epi32(zld8x2(p, gs)); }

T_ZMM __attribute__((noinline)) static void kernel_b(void) {
    const size_t gs = NB * EI_PK_Q4K_BYTES;
    const uint8_t *p = packed;
    float (*y)[ROWS] = y_b;
    for (int t = 0; t < TOKENS; t++) _mm512_storeu_ps(y[t], _mm512_setzero_ps());
    for (int b = 0; b < NB; b++, p += EI_PK_Q4K_BYTES) {
        const __m512 dv = zh2f(p, gs), mv = zh2f(p + 16, gs);
        __m512 dsc[8];
        for (int j = 0; j < 8; j++) dsc[j] = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(zu8i(p + 32 + 8 * j, gs)));
        __m512i mins[4];   /* lane r: the int16 pair (min of sub-block 2i, of 2i + 1) of row r */
        for (int i = 0; i < 4; i++)
            mins[i] = _mm512_or_si512(zu8i(p + 96 + 16 * i, gs), _mm512_slli_epi32(zu8i(p + 104 + 16 * i, gs), 16));
        __m512 sb[TOKENS];
        for (int t = 0; t < TOKENS; t++) sb[t] = _mm512_setzero_ps();
        for (int pr = 0; pr < 4; pr++) {
            __m512i w0[8], w1[8];
            znibbles8(p + EI_PK_HDR_Q4K + 256 * pr, gs, w0, w1);
            for (int t = 0; t < TOKENS; t += 4) {
                __m512i s[4], u[4];
                const int8_t *q[4];
                for (int i = 0; i < 4; i++) {
                    q[i] = act256[t + i][b].q + 64 * pr;
                    s[i] = zdpb4(_mm512_setzero_si512(), w0[0], q[i]);
                    u[i] = zdpb4(_mm512_setzero_si512(), w1[0], q[i] + 32);
                }
                for (int k = 1; k < 8; k++)
                    for (int i = 0; i < 4; i++) {
                        s[i] = zdpb4(s[i], w0[k], q[i] + 4 * k);
                        u[i] = zdpb4(u[i], w1[k], q[i] + 32 + 4 * k);
                    }
                for (int i = 0; i < 4; i++) {
                    sb[t + i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), dsc[2 * pr], sb[t + i]);
                    sb[t + i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u[i]), dsc[2 * pr + 1], sb[t + i]);
                }
            }
        }
        for (int t = 0; t < TOKENS; t++) {
            const q8k *a = &act256[t][b];
            __m512i m = _mm512_setzero_si512();
            for (int i = 0; i < 4; i++) {
                int32_t pair;
                memcpy(&pair, a->bsum + 2 * i, 4);
                m = _mm512_dpwssd_epi32(m, mins[i], _mm512_set1_epi32(pair));
            }
            const __m512 ad = _mm512_set1_ps(a->d);
            const __m512 r = _mm512_fmadd_ps(sb[t], ad, _mm512_loadu_ps(y[t]));
            _mm512_storeu_ps(y[t], _mm512_fnmadd_ps(_mm512_mul_ps(mv, ad), _mm512_cvtepi32_ps(m), r));
        }
    }
}

/* One token (decode), 8 rows a call as the shipped ei_packed_q4_k_x1_vnni (kq45k_1) over G1 row
 * groups: B1 is its scheme (two groups of 4 bytes a zmm register, the activation's dwords put
 * under them by vpermd) over B's activation format. */
enum { G1 = 64 };
static uint8_t packed1[G1 * NB * EI_PK_Q4K_BYTES] __attribute__((aligned(64)));
static float y1_a[G1 * EI_PACK_ROWS], y1_b[G1 * EI_PACK_ROWS];

ZINL __m256i u8i8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

T_ZMM __attribute__((noinline)) static void kernel_b1(void) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i i01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i two = _mm512_set1_epi32(2);
    for (int g = 0; g < G1; g++) {
        const uint8_t *p = packed1 + (size_t)g * NB * EI_PK_Q4K_BYTES;
        __m256 acc = _mm256_setzero_ps();
        for (int b = 0; b < NB; b++, p += EI_PK_Q4K_BYTES) {
            ei_prefetch_ahead(p, EI_PK_Q4K_BYTES);
            const q8k *a = &act256[0][b];
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
            const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
            __m256i m = _mm256_setzero_si256();
            for (int i = 0; i < 4; i++) {
                int32_t pair;
                memcpy(&pair, a->bsum + 2 * i, 4);
                const __m256i mn = _mm256_or_si256(u8i8(p + 96 + 16 * i), _mm256_slli_epi32(u8i8(p + 104 + 16 * i), 16));
                m = _mm256_dpwssd_epi32(m, mn, _mm256_set1_epi32(pair));
            }
            __m256 sb = _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int pr = 0; pr < 4; pr++) {
                const uint8_t *qp = p + EI_PK_HDR_Q4K + 256 * pr;
                const __m512i x0 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a->q + 64 * pr)));
                const __m512i x1 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a->q + 64 * pr + 32)));
                __m512i s = _mm512_setzero_si512(), u = _mm512_setzero_si512(), idx = i01;
                for (int k = 0; k < 8; k += 2, idx = _mm512_add_epi32(idx, two)) {
                    const __m512i v = _mm512_loadu_si512((const void *)(qp + 32 * k));
                    s = _mm512_dpbusd_epi32(s, _mm512_and_si512(v, m4), _mm512_permutexvar_epi32(idx, x0));
                    u = _mm512_dpbusd_epi32(u, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                            _mm512_permutexvar_epi32(idx, x1));
                }
                const __m256i s0 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
                const __m256i u0 = _mm256_add_epi32(_mm512_castsi512_si256(u), _mm512_extracti64x4_epi64(u, 1));
                const __m256 dsc0 = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(u8i8(p + 32 + 16 * pr)));
                const __m256 dsc1 = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(u8i8(p + 40 + 16 * pr)));
                sb = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), dsc0, sb);
                sb = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u0), dsc1, sb);
            }
            const __m256 ad = _mm256_set1_ps(a->d);
            acc = _mm256_fmadd_ps(sb, ad, acc);
            acc = _mm256_fnmadd_ps(_mm256_mul_ps(mv, ad), _mm256_cvtepi32_ps(m), acc);
        }
        _mm256_storeu_ps(y1_b + EI_PACK_ROWS * g, acc);
    }
}

/* B's format in float64, from the packed bytes: row r, token t */
static double reference_b(int r, int t) {
    const size_t gs = NB * EI_PK_Q4K_BYTES;
    double y = 0;
    for (int b = 0; b < NB; b++) {
        const uint8_t *p = packed + b * EI_PK_Q4K_BYTES + (r >= EI_PACK_ROWS ? gs : 0);
        const int rr = r % EI_PACK_ROWS;
        const double d = ei_h2f(ei_ld16(p + 2 * rr)), dmin = ei_h2f(ei_ld16(p + 16 + 2 * rr));
        const q8k *a = &act256[t][b];
        for (int j = 0; j < 8; j++) {
            long isum = 0;
            for (int l = 0; l < 32; l++) {
                const uint8_t byte = p[EI_PK_HDR_Q4K + 256 * (j >> 1) + 32 * (l >> 2) + 4 * rr + (l & 3)];
                isum += (long)((byte >> (4 * (j & 1))) & 15) * a->q[32 * j + l];
            }
            y += a->d * (d * p[32 + 8 * j + rr] * (double)isum - dmin * p[96 + 8 * j + rr] * (double)a->bsum[j]);
        }
    }
    return y;
}

int main(void) {
    srand(1);
    static block_q4_K w[ROWS][NB];
    for (int r = 0; r < ROWS; r++)
        for (int b = 0; b < NB; b++) {
            uint8_t *raw = (uint8_t *)&w[r][b];
            for (size_t i = 0; i < sizeof(block_q4_K); i++) raw[i] = (uint8_t)rand();
            w[r][b].d = (uint16_t)(0x2000 | (rand() & 0x3ff));   /* f16 in [2^-7, 2^-6) */
            w[r][b].dmin = (uint16_t)(0x2000 | (rand() & 0x3ff));
        }
    ei_pack_k(EI_TYPE_Q4_K, w, ROWS, NB * QKK, 0, packed);
    ei_pack_k(EI_TYPE_Q4_K, w, ROWS, NB * QKK, ROWS / EI_PACK_ROWS, packed_pair);
    for (int t = 0; t < TOKENS; t++) {
        for (int j = 0; j < NB * 8; j++) {
            int sum = 0;
            act32[t][j].d = 0.01f;
            for (int l = 0; l < 32; l++) sum += act32[t][j].q[l] = (int8_t)(rand() % 255 - 127);
            act32[t][j].s = act32[t][j].d * sum;
        }
        for (int b = 0; b < NB; b++) {
            act256[t][b].d = 0.01f;
            for (int j = 0; j < 8; j++) {
                int sum = 0;
                for (int l = 0; l < 32; l++) sum += act256[t][b].q[32 * j + l] = (int8_t)(rand() % 255 - 127);
                act256[t][b].bsum[j] = (int16_t)sum;
            }
        }
    }
    double worst = 0;
    kernel_b();
    for (int t = 0; t < TOKENS; t++) {   /* error over the token's largest result */
        double ref[ROWS], top = 0;
        for (int r = 0; r < ROWS; r++) top = fmax(top, fabs(ref[r] = reference_b(r, t)));
        for (int r = 0; r < ROWS; r++) worst = fmax(worst, fabs(y_b[t][r] - ref[r]) / top);
    }
    double best_a = 1e9, best_b = 1e9;
    for (int pass = 0; pass < PASSES; pass++) {
        double t0 = now();
        for (int i = 0; i < CALLS; i++)
            ei_packed_q4_k_x16r16_vnni(packed_pair, NB, act32[0], sizeof act32[0], y_a[0], ROWS);
        best_a = fmin(best_a, now() - t0);
        t0 = now();
        for (int i = 0; i < CALLS; i++) kernel_b();
        best_b = fmin(best_b, now() - t0);
    }
    for (int g = 0; g < G1; g += 2)   /* G1 / 2 copies of the 16 rows */
        memcpy(packed1 + (size_t)g * NB * EI_PK_Q4K_BYTES, packed, sizeof packed);
    for (int g = 0; g < G1; g++)
        ei_packed_q4_k_x1_vnni(packed1 + (size_t)g * NB * EI_PK_Q4K_BYTES, NB, act32[0], 0, y1_a + EI_PACK_ROWS * g, 0);
    kernel_b1();
    for (int g = 0; g < G1; g++) {   /* B1 against B's first token */
        double top = 0;
        for (int r = 0; r < ROWS; r++) top = fmax(top, fabs(y_b[0][r]));
        for (int r = 0; r < EI_PACK_ROWS; r++)
            worst = fmax(worst, fabs(y1_b[EI_PACK_ROWS * g + r] - y_b[0][EI_PACK_ROWS * (g % 2) + r]) / top);
    }
    double best_a1 = 1e9, best_b1 = 1e9;
    for (int pass = 0; pass < PASSES; pass++) {
        double t0 = now();
        for (int i = 0; i < CALLS / G1 * 8; i++)
            for (int g = 0; g < G1; g++)
                ei_packed_q4_k_x1_vnni(packed1 + (size_t)g * NB * EI_PK_Q4K_BYTES, NB, act32[0], 0,
                                       y1_a + EI_PACK_ROWS * g, 0);
        best_a1 = fmin(best_a1, now() - t0);
        t0 = now();
        for (int i = 0; i < CALLS / G1 * 8; i++) kernel_b1();
        best_b1 = fmin(best_b1, now() - t0);
    }
    const double bytes1 = (double)G1 * NB * EI_PK_Q4K_BYTES * (CALLS / G1 * 8);
    const double macs = (double)ROWS * TOKENS * NB * QKK * CALLS;
    printf("Q4_K, %d rows x %d tokens x %d elements, one thread, cache-resident:\n", ROWS, TOKENS, NB * QKK);
    printf("  A per-32 activation scales (shipped): %.1f billion multiply-adds/s\n", macs / best_a / 1e9);
    printf("  B one scale per 256 (prototype):      %.1f billion multiply-adds/s, %.3fx A\n", macs / best_b / 1e9,
           best_a / best_b);
    printf("Q4_K, one token, %d rows x %d elements (%.0f KiB), one thread:\n", G1 * EI_PACK_ROWS, NB * QKK,
           G1 * NB * EI_PK_Q4K_BYTES / 1024.0);
    printf("  A1 per-32 activation scales (8-row ei_packed_q4_k_x1_vnni): %.1f GB/s of packed weights\n",
           bytes1 / best_a1 / 1e9);
    printf("  B1 one scale per 256 (prototype):      %.1f GB/s, %.3fx A1\n", bytes1 / best_b1 / 1e9, best_a1 / best_b1);
    printf("  B and B1 against their float64 sums: worst error %.1e of the token's largest result\n", worst);
    return worst < 1e-5 ? 0 : 1;
}
