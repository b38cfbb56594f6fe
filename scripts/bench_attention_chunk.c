/* The AVX-512 F16 attention kernel on one 256-cell chunk, one token a call against two
 * (ei_attend_chunk_avx512 against ei_attend_pair_avx512): microseconds a token, the best of 5
 * passes, one thread. CHUNKS chunks are cycled through: 1 keeps the chunk in the cache, 1024
 * (67 MB at heads of 64) reads each from memory.
 *
 *   gcc -O3 -DNDEBUG -Inative/src -Inative/include scripts/bench_attention_chunk.c \
 *       native/src/attention_avx512.c -o /tmp/bench_attention_chunk -lm
 *   /tmp/bench_attention_chunk HD GROUP [CHUNKS]      (x86-64 with AVX-512 only)
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "attention.h"

enum { CELLS = EI_ATTN_CHUNK, CALLS = 20000 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int hd = argc > 2 ? atoi(argv[1]) : 0, g = argc > 2 ? atoi(argv[2]) : 0;
    const int n_chunks = argc > 3 ? atoi(argv[3]) : 1;
    if (argc < 3 || hd < 16 || hd % 16 || hd > EI_ATTN_MAX_HD || g < 1 || g > 16 || n_chunks < 1) {
        fprintf(stderr, "usage: %s HD GROUP [CHUNKS]   (HD a multiple of 16 up to %d, GROUP 1..16)\n", argv[0],
                EI_ATTN_MAX_HD);
        return 2;
    }
    const size_t chunk_bytes = (size_t)CELLS * hd * 2;
    uint8_t *k = aligned_alloc(64, chunk_bytes * n_chunks), *v = aligned_alloc(64, chunk_bytes * n_chunks);
    float *q = malloc(sizeof(float) * 2 * g * hd), *scores = malloc(sizeof(float) * 2 * g * CELLS);
    float *parts = malloc(sizeof(float) * 2 * g * EI_ATTN_PART_FLOATS(hd));
    if (!k || !v || !q || !scores || !parts) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < chunk_bytes * n_chunks / 2; i++) {   /* small f16 values: 0x3000.. is about 0.125 */
        ((uint16_t *)k)[i] = (uint16_t)(0x3000 + (i & 0xff));
        ((uint16_t *)v)[i] = (uint16_t)(0x3400 + (i % 97));
    }
    for (int i = 0; i < 2 * g * hd; i++) q[i] = (float)(i % 13) * 0.01f;
    int32_t cell_pos[CELLS];
    for (int c = 0; c < CELLS; c++) cell_pos[c] = c;
    const float *qs[2] = {q, q + (size_t)g * hd};
    float *part[2] = {parts, parts + (size_t)g * EI_ATTN_PART_FLOATS(hd)};
    const int32_t pos[2] = {CELLS - 1, CELLS - 1};
    double one = 1e30, two = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = now();
        for (int i = 0; i < CALLS; i++) {
            const size_t off = (size_t)(i % n_chunks) * chunk_bytes;
            ei_attend_chunk_avx512(q, g, k + off, v + off, cell_pos, 0, CELLS, CELLS, CELLS - 1, hd, 0.125f, scores,
                                   parts);
        }
        const double a = (now() - t0) / CALLS;
        t0 = now();
        for (int i = 0; i < CALLS / 2; i++) {
            const size_t off = (size_t)(i % n_chunks) * chunk_bytes;
            ei_attend_pair_avx512(qs, g, k + off, v + off, cell_pos, 0, CELLS, CELLS, pos, hd, 0.125f, scores, part);
        }
        const double b = (now() - t0) / CALLS;   /* CALLS / 2 calls of two tokens */
        one = a < one ? a : one;
        two = b < two ? b : two;
    }
    printf("hd %d group %d, %d chunk(s): one token a call %.3f us a token, two %.3f (%.2fx)\n", hd, g, n_chunks,
           one * 1e6, two * 1e6, one / two);
    return 0;
}
