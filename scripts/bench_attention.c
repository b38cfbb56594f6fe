/* Decode attention over an F16 or Q8_0 KV at depth, as the runtime schedules it: per layer one
 * pool run in which the threads claim (kv head, chunk) items from a counter, RUN consecutive
 * chunks a claim, each item one ei_attend_chunk_avx512 (or _q8_avx512) call (4 query heads of
 * 64, Llama-3.2-1B's group). Prints the best of 8 tokens: ms a token and ns a cell a thread. The
 * KV is 16 layers x 8 kv heads x CELLS cells x 256 bytes (F16 K + V; Q8_0 136), far past the
 * caches from a few hundred cells on.
 *
 *   gcc -O3 -DNDEBUG -Inative/src -Inative/include scripts/bench_attention.c \
 *       native/src/attention_avx512.c native/src/attention_q8_avx512.c -o /tmp/bench_attention -lpthread -lm
 *   /tmp/bench_attention CELLS RUN THREADS [f16|q8_0]        (x86-64 with AVX-512 only)
 *
 * Build it from two trees and run the two binaries by turns to compare kernels. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention.h"

enum { LAYERS = 16, KV_HEADS = 8, GROUP = 4, HD = 64, TOKENS = 8, MAX_THREADS = 64 };
static int n_cells, n_chunks, run, n_threads;
static size_t row_bytes;   /* of one cell's K (or V) of one kv head */
static void (*attend)(const float *, int, const uint8_t *, const uint8_t *, const int32_t *, int32_t, int32_t, int32_t,
                      int32_t, int, float, float *, float *) = ei_attend_chunk_avx512;
static uint8_t *kv_k, *kv_v;
static int32_t *cell_pos;
static float *query;
static atomic_long next_item[LAYERS];
static pthread_barrier_t layer_done;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void attend_layer(int layer, float *scores, float *part) {
    const long total = (long)KV_HEADS * n_chunks;
    long first;
    while ((first = atomic_fetch_add(&next_item[layer], run)) < total)
        for (long item = first; item < first + run && item < total; item++) {
            const size_t off = (size_t)(layer * KV_HEADS + item / n_chunks) * n_cells * row_bytes;
            const int32_t c0 = (int32_t)(item % n_chunks) * EI_ATTN_CHUNK;
            const int32_t c1 = c0 + EI_ATTN_CHUNK < n_cells ? c0 + EI_ATTN_CHUNK : n_cells;
            attend(query, GROUP, kv_k + off, kv_v + off, cell_pos, c0, c1, n_cells, n_cells, HD, 0.125f, scores, part);
        }
    pthread_barrier_wait(&layer_done);
}

static void *worker(void *arg) {
    (void)arg;
    float *scores = malloc(sizeof(float) * GROUP * EI_ATTN_CHUNK);
    float *part = malloc(sizeof(float) * GROUP * EI_ATTN_PART_FLOATS(HD));
    for (int t = 0; t < TOKENS; t++) {
        pthread_barrier_wait(&layer_done);   /* the main thread has reset the counters */
        for (int l = 0; l < LAYERS; l++) attend_layer(l, scores, part);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const int q8 = argc == 5 && !strcmp(argv[4], "q8_0");
    if ((argc != 4 && argc != 5) || (argc == 5 && !q8 && strcmp(argv[4], "f16"))) {
        fprintf(stderr, "usage: %s CELLS RUN THREADS [f16|q8_0]\n", argv[0]);
        return 2;
    }
    row_bytes = q8 ? HD / 32 * 34 : HD * 2;
    if (q8) attend = ei_attend_chunk_q8_avx512;
    n_cells = atoi(argv[1]), run = atoi(argv[2]), n_threads = atoi(argv[3]);
    if (n_cells < 1 || run < 1 || n_threads < 1 || n_threads > MAX_THREADS) {
        fprintf(stderr, "CELLS and RUN must be >= 1, THREADS 1..%d\n", MAX_THREADS);
        return 2;
    }
    n_chunks = (n_cells + EI_ATTN_CHUNK - 1) / EI_ATTN_CHUNK;
    const size_t bytes = (size_t)LAYERS * KV_HEADS * n_cells * row_bytes;
    kv_k = aligned_alloc(64, bytes), kv_v = aligned_alloc(64, bytes);
    cell_pos = malloc(sizeof(int32_t) * n_cells), query = malloc(sizeof(float) * GROUP * HD);
    if (!kv_k || !kv_v || !cell_pos || !query) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < bytes / 2; i++) {   /* small f16 values: 0x3000.. is about 0.125 */
        ((uint16_t *)kv_k)[i] = (uint16_t)(0x3000 + (i & 0xff));
        ((uint16_t *)kv_v)[i] = (uint16_t)(0x3400 + (i % 97));
    }
    if (q8)   /* Q8_0 blocks of 34 bytes: an f16 scale (about 0.004), then 32 quants */
        for (size_t i = 0; i < bytes; i += 34) {
            ((uint16_t *)(kv_k + i))[0] = ((uint16_t *)(kv_v + i))[0] = 0x1c00;
            for (int j = 2; j < 34; j++) kv_k[i + j] = (uint8_t)(i + 7 * j), kv_v[i + j] = (uint8_t)(i * 3 + j);
        }
    for (int c = 0; c < n_cells; c++) cell_pos[c] = c;
    for (int i = 0; i < GROUP * HD; i++) query[i] = (float)(i % 7) * 0.1f;
    pthread_barrier_init(&layer_done, NULL, (unsigned)n_threads);
    pthread_t th[MAX_THREADS];
    for (int i = 1; i < n_threads; i++) pthread_create(&th[i], NULL, worker, NULL);
    float *scores = malloc(sizeof(float) * GROUP * EI_ATTN_CHUNK);
    float *part = malloc(sizeof(float) * GROUP * EI_ATTN_PART_FLOATS(HD));
    double best = 1e30;
    for (int t = 0; t < TOKENS; t++) {
        for (int l = 0; l < LAYERS; l++) atomic_store(&next_item[l], 0);
        pthread_barrier_wait(&layer_done);
        const double t0 = now();
        for (int l = 0; l < LAYERS; l++) attend_layer(l, scores, part);
        const double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    for (int i = 1; i < n_threads; i++) pthread_join(th[i], NULL);
    printf("%s cells %d run %d threads %d: %.2f ms a token, %.1f ns a cell a thread\n", q8 ? "q8_0" : "f16", n_cells, run, n_threads,
           best * 1e3, best * 1e9 * n_threads / ((double)LAYERS * KV_HEADS * n_cells));
    return 0;
}
