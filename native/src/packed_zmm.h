/* AVX-512 loads of two packed row groups (16 rows) into one register: group g's bytes at p,
 * group g+1's gs bytes later (packed.h: one block later in the 32-block types' row pairs, the
 * next chunk in the K-quants', one group later for Q5_K), one load where they are adjacent.
 * Shared by the 16-row kernels of packed.c and packed_k_simd.h. */
#ifndef EI_PACKED_ZMM_H
#define EI_PACKED_ZMM_H
#if defined(__x86_64__)
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define T_ZMM __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define ZINL static inline T_ZMM __attribute__((always_inline))

/* 32 bytes of each group */
ZINL __m512i zld2(const uint8_t *p, size_t gs) {
    if (gs == 32) return _mm512_loadu_si512((const void *)p);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                              _mm256_loadu_si256((const __m256i *)(p + gs)), 1);
}

/* 8 bytes of each group */
ZINL __m128i zld8x2(const uint8_t *p, size_t gs) {
    if (gs == 8) return _mm_loadu_si128((const __m128i *)p);
    return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p), _mm_loadl_epi64((const __m128i *)(p + gs)));
}

/* 8 f16 of each group (the 8 rows' scales) as 16 floats */
ZINL __m512 zh2f(const uint8_t *p, size_t gs) {
    if (gs == 16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                                   _mm_loadu_si128((const __m128i *)(p + gs)), 1));
}

/* acc + the dot of w's unsigned bytes with the 4 signed activation bytes at p in every lane,
 * the broadcast read inside the instruction ({1to16}): left to itself the compiler loads it
 * with a vpbroadcastd of its own, one more uop per vpdpbusd */
ZINL __m512i zdpb4(__m512i acc, __m512i w, const int8_t *p) {
    __asm__("vpdpbusd %[q]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [q] "m"(*(const int32_t *)p));
    return acc;
}

/* 4 activation bytes in every lane */
ZINL __m512i zbcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
#endif
#endif
