/* How fast can this machine stream a decode step's bytes? Reads W bytes (the
 * weights), then times reading K bytes (the KV cells) that the weights pushed
 * out of the cache, as a decoded token does; best of R rounds.
 *   memory_floor WEIGHT_BYTES KV_BYTES THREADS ROUNDS
 * prints: weights_s kv_s (seconds, one line). Built and run by memory_floor.py. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct {
    const char *p;
    size_t n;
    float sum;
} part;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx2"))) static void *read_part(void *raw) {
    part *pt = raw;
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (size_t i = 0; i + 64 <= pt->n; i += 64) { /* two independent streams of loads */
        a = _mm256_add_ps(a, _mm256_load_ps((const float *)(pt->p + i)));
        b = _mm256_add_ps(b, _mm256_load_ps((const float *)(pt->p + i + 32)));
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(a, b));
    pt->sum = out[0];
    return NULL;
}

static double stream(const char *buf, size_t n, int threads) {
    pthread_t th[64];
    part parts[64];
    const size_t per = n / (size_t)threads / 64 * 64;
    const double t0 = now();
    for (int i = 0; i < threads; i++) {
        parts[i] = (part){buf + per * (size_t)i, per, 0.0f};
        pthread_create(&th[i], NULL, read_part, &parts[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    return now() - t0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: memory_floor WEIGHT_BYTES KV_BYTES THREADS ROUNDS\n");
        return 2;
    }
    const size_t w = (size_t)atof(argv[1]) / 64 * 64 + 64, kv = (size_t)atof(argv[2]) / 64 * 64 + 64;
    const int threads = atoi(argv[3]), rounds = atoi(argv[4]);
    if (threads < 1 || threads > 64 || rounds < 1) return 2;
    /* 2 MiB pages, as the runtime's arenas: with 4 KiB pages TLB misses, not DRAM, set the pace */
    const size_t huge = (size_t)2 << 20;
    const size_t wsz = (w + huge - 1) / huge * huge, ksz = (kv + huge - 1) / huge * huge;
    char *wb = aligned_alloc(huge, wsz), *kb = aligned_alloc(huge, ksz);
    if (!wb || !kb) return 1;
    madvise(wb, wsz, MADV_HUGEPAGE);
    madvise(kb, ksz, MADV_HUGEPAGE);
    memset(wb, 1, w);
    memset(kb, 1, kv);
    double best_w = 1e30, best_kv = 1e30;
    for (int r = 0; r < rounds; r++) {
        const double tw = stream(wb, w, threads), tk = stream(kb, kv, threads);
        best_w = tw < best_w ? tw : best_w;
        best_kv = tk < best_kv ? tk : best_kv;
    }
    printf("%.9f %.9f\n", best_w, best_kv);
    return 0;
}
