/* The integer core of the packed kernels (x86): the sum over k < n of w[k] . q[4k..4k+3], where
 * w[k] holds 4 unsigned weight bytes of each of 8 rows (one row a 32-bit lane, packed.h) and q
 * is one activation block's signed bytes, broadcast 4 at a time. The result is exact, so every
 * instruction set gives the same integers.
 *
 * VNNI: one vpdpbusd a group. AVX2 has no byte dot to 32 bits: maddubs gives each row two int16
 * pair sums, and madd by ones widens them. Adding `run` maddubs results as int16 before one madd
 * makes a run cost run + 1 multiplies instead of 2 * run; the int16 sums stay exact while
 * run * 2 * wmax * 128 <= 32767: run 8 for 4-bit weights (30720), 4 for 5-bit, 2 for 6-bit. */
#ifndef EI_PACKED_DOT_H
#define EI_PACKED_DOT_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Makes v a register at this point: GCC otherwise reassociates a run's int16 adds, computing
 * every product first and spilling them (the token-inner Q4_K kernel ran at 0.71x). */
#define EI_PIN(v) __asm__("" : "+x"(v))

/* Makes the compiler keep array p in memory (its address escapes): the kernels' float sums that
 * do not fit in registers, which GCC would otherwise try to promote to registers and spill. */
#define EI_IN_MEMORY(p) __asm__("" : : "r"(p) : "memory")

/* The multi-token kernels' float sums, a vector of 8 rows per token: in registers (acc), or in
 * memory (sums, EI_IN_MEMORY, 32-byte aligned) where they would not fit beside the kernel's other
 * vectors (in_mem). */
static inline __attribute__((target("avx"), always_inline)) void ei_sums_zero(int in_mem, int nt, __m256 *acc,
                                                                             float *sums) {
    for (int t = 0; t < nt; t++)
        if (in_mem)
            _mm256_store_ps(sums + 8 * t, _mm256_setzero_ps());
        else
            acc[t] = _mm256_setzero_ps();
}
static inline __attribute__((target("avx"), always_inline)) __m256 ei_sum_get(int in_mem, const __m256 *acc,
                                                                             const float *sums, int t) {
    return in_mem ? _mm256_load_ps(sums + 8 * t) : acc[t];
}
static inline __attribute__((target("avx"), always_inline)) void ei_sum_put(int in_mem, __m256 *acc, float *sums,
                                                                           int t, __m256 r) {
    if (in_mem)
        _mm256_store_ps(sums + 8 * t, r);
    else
        acc[t] = r;
}
static inline __attribute__((target("avx"), always_inline)) void ei_sums_store(int in_mem, int nt, const __m256 *acc,
                                                                              const float *sums, float *y,
                                                                              int64_t ldy) {
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(y + t * ldy, ei_sum_get(in_mem, acc, sums, t));
}

/* The longest exact int16 run for weights below 2^bits. */
#define EI_DOT_RUN(bits) ((bits) <= 4 ? 8 : (bits) == 5 ? 4 : 2)

static inline __attribute__((target("avx2"), always_inline)) __m256i ei_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* n (even) groups; run divides n. */
static inline __attribute__((target("avx2"), always_inline)) __m256i ei_dot_avx2(const __m256i *w, const int8_t *q,
                                                                                int n, int run) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256();
    for (int k0 = 0; k0 < n; k0 += run) {
        __m256i p0 = _mm256_maddubs_epi16(w[k0], ei_bcast4(q + 4 * k0));
        __m256i p1 = _mm256_maddubs_epi16(w[k0 + 1], ei_bcast4(q + 4 * k0 + 4));
        for (int k = k0 + 2; k < k0 + run; k += 2) {
            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(w[k], ei_bcast4(q + 4 * k)));
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(w[k + 1], ei_bcast4(q + 4 * k + 4)));
        }
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones));
    }
    return s;
}

/* Q8_0 on AVX2: the packed bytes are the quants + 128 (VNNI's unsigned operand), and that
 * offset times an activation byte would saturate maddubs's int16 pair sums. So the quant is
 * restored (xor 0x80) and its sign moved onto the activation: |w| * (sign(w) a), each pair sum at
 * most 2 * 128 * 127 < 2^15 (a quant of -128 too: its |w| reads as 128 unsigned). No run: every
 * maddubs is widened at once. The result is sum w * a (no offset term). */
static inline __attribute__((target("avx2"), always_inline)) __m256i ei_q8_signed(__m256i w) {
    return _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
}
static inline __attribute__((target("avx2"), always_inline)) __m256i ei_dot_q8_group(__m256i abs_w, __m256i w,
                                                                                    const int8_t *q) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(ei_bcast4(q), w)), _mm256_set1_epi16(1));
}
static inline __attribute__((target("avx2"), always_inline)) __m256i ei_dot_avx2_q8(const __m256i *w, const int8_t *q,
                                                                                   int n) {
    __m256i s = _mm256_setzero_si256();
    for (int k = 0; k < n; k++) {
        const __m256i ws = ei_q8_signed(w[k]);
        s = _mm256_add_epi32(s, ei_dot_q8_group(_mm256_abs_epi8(ws), ws, q + 4 * k));
    }
    return s;
}

/* VNNI: two vpdpbusd chains, the first started at s (an integer to add, at no cost) */
static inline __attribute__((target("avx2,avx512f,avx512vl,avx512vnni"), always_inline)) __m256i
ei_dot_vnni_from(__m256i s, const __m256i *w, const int8_t *q, int n) {
    __m256i s0 = s, s1 = _mm256_setzero_si256();
    for (int k = 0; k < n; k += 2) {
        s0 = _mm256_dpbusd_epi32(s0, w[k], ei_bcast4(q + 4 * k));
        s1 = _mm256_dpbusd_epi32(s1, w[k + 1], ei_bcast4(q + 4 * k + 4));
    }
    return _mm256_add_epi32(s0, s1);
}
static inline __attribute__((target("avx2,avx512f,avx512vl,avx512vnni"), always_inline)) __m256i
ei_dot_vnni(const __m256i *w, const int8_t *q, int n) {
    return ei_dot_vnni_from(_mm256_setzero_si256(), w, q, n);
}
#endif
