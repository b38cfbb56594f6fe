/* How fast can this machine read a decode step's bytes? The best read loop we can
 * write, so that the figure is an upper bound no engine's decode passes: every
 * configuration below is timed, round-robin, and the fastest counts.
 *
 *   memory_floor WEIGHT_BYTES KV_BYTES MAX_THREADS ROUNDS
 *
 * Each round, for each configuration (threads 1, 2, 4, ... and MAX_THREADS x independent
 * streams per thread x software prefetch on/off): read the weights twice (after
 * the KV, as at depth; after the weights, as a shallow decode rereads them), then
 * the KV (which the weights pushed out of the cache). 64-byte loads; AVX-512,
 * AVX2, NEON or scalar picked at run time by cpuid (per-function target
 * attributes, as the runtime's kernels: no -march flag). Buffers ask for 2 MiB
 * pages (MADV_HUGEPAGE).
 *
 * prints:  isa NAME
 *          hugepages FRACTION_GRANTED
 *          config THREADS STREAMS PREFETCH BEST_WEIGHTS_S BEST_KV_S MEDIAN_WEIGHTS_S   (one line each)
 * The median of a configuration's weight reads shows the host's spread: the floor is the best. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define X86 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#define LINE 64
#define MAX_THREADS 256
#define MAX_STREAMS 8
#define PREFETCH_AHEAD (16 * LINE) /* per stream: far enough to cover DRAM latency at full rate */

typedef struct {
    const char *p;
    size_t n; /* bytes, a multiple of LINE * streams */
    int streams, prefetch;
    uint64_t sink;
} part;

typedef uint64_t (*read_fn)(const char *p, size_t n, int streams, int prefetch);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The loops below are bodies specialized by stream count (BY_STREAMS), so that each stream's
 * accumulator stays in a register: with the count a run-time variable they lived on the stack,
 * and the store-to-load chain through them held one stream to about 17 GB/s on a thread that
 * reads 29 (AMD EPYC Zen 4). */
#define BODY_ATTR static inline __attribute__((always_inline))
#define BY_STREAMS(body)                                                                      \
    switch (streams) {                                                                        \
    case 1: return body(p, n, 1, prefetch);                                                   \
    case 4: return body(p, n, 4, prefetch);                                                   \
    case 8: return body(p, n, 8, prefetch);                                                   \
    default: return body(p, n, streams, prefetch);                                            \
    }

/* Each loop splits its range into `streams` equal runs read side by side: several
 * independent address streams keep more of the hardware prefetchers busy. */
#define STREAM_BASES                                                   \
    const size_t run = n / (size_t)streams;                            \
    const char *base[MAX_STREAMS];                                     \
    for (int s = 0; s < streams; s++) base[s] = p + (size_t)s * run;

BODY_ATTR uint64_t read_scalar_body(const char *p, size_t n, int streams, int prefetch) {
    STREAM_BASES
    uint64_t acc[MAX_STREAMS] = {0};
    for (size_t i = 0; i < run; i += LINE)
        for (int s = 0; s < streams; s++) {
            const uint64_t *q = (const uint64_t *)(base[s] + i);
            if (prefetch) __builtin_prefetch(base[s] + i + PREFETCH_AHEAD);
            acc[s] |= (q[0] | q[1]) ^ (q[2] | q[3]) ^ (q[4] | q[5]) ^ (q[6] | q[7]);
        }
    uint64_t r = 0;
    for (int s = 0; s < streams; s++) r ^= acc[s];
    return r;
}
static uint64_t read_scalar(const char *p, size_t n, int streams, int prefetch) {
    BY_STREAMS(read_scalar_body)
}

#ifdef X86
__attribute__((target("avx2"))) BODY_ATTR uint64_t read_avx2_body(const char *p, size_t n, int streams, int prefetch) {
    STREAM_BASES
    __m256i acc[MAX_STREAMS];
    for (int s = 0; s < MAX_STREAMS; s++) acc[s] = _mm256_setzero_si256();
    for (size_t i = 0; i < run; i += LINE)
        for (int s = 0; s < streams; s++) {
            const char *q = base[s] + i;
            if (prefetch) _mm_prefetch(q + PREFETCH_AHEAD, _MM_HINT_T0);
            acc[s] = _mm256_or_si256(acc[s], _mm256_or_si256(_mm256_load_si256((const __m256i *)q),
                                                             _mm256_load_si256((const __m256i *)(q + 32))));
        }
    __m256i r = _mm256_setzero_si256();
    for (int s = 0; s < streams; s++) r = _mm256_xor_si256(r, acc[s]);
    return (uint64_t)_mm256_extract_epi64(r, 0) ^ (uint64_t)_mm256_extract_epi64(r, 3);
}
__attribute__((target("avx2"))) static uint64_t read_avx2(const char *p, size_t n, int streams, int prefetch) {
    BY_STREAMS(read_avx2_body)
}

__attribute__((target("avx512f"))) BODY_ATTR uint64_t read_avx512_body(const char *p, size_t n, int streams, int prefetch) {
    STREAM_BASES
    __m512i acc[MAX_STREAMS];
    for (int s = 0; s < MAX_STREAMS; s++) acc[s] = _mm512_setzero_si512();
    for (size_t i = 0; i < run; i += LINE)
        for (int s = 0; s < streams; s++) {
            const char *q = base[s] + i;
            if (prefetch) _mm_prefetch(q + PREFETCH_AHEAD, _MM_HINT_T0);
            acc[s] = _mm512_or_si512(acc[s], _mm512_load_si512((const void *)q));
        }
    __m512i r = _mm512_setzero_si512();
    for (int s = 0; s < streams; s++) r = _mm512_xor_si512(r, acc[s]);
    return (uint64_t)_mm512_reduce_or_epi64(r);
}
__attribute__((target("avx512f"))) static uint64_t read_avx512(const char *p, size_t n, int streams, int prefetch) {
    BY_STREAMS(read_avx512_body)
}
#endif

#ifdef __aarch64__
BODY_ATTR uint64_t read_neon_body(const char *p, size_t n, int streams, int prefetch) {
    STREAM_BASES
    uint8x16_t acc[MAX_STREAMS];
    for (int s = 0; s < MAX_STREAMS; s++) acc[s] = vdupq_n_u8(0);
    for (size_t i = 0; i < run; i += LINE)
        for (int s = 0; s < streams; s++) {
            const uint8_t *q = (const uint8_t *)(base[s] + i);
            if (prefetch) __builtin_prefetch(q + PREFETCH_AHEAD);
            acc[s] = vorrq_u8(acc[s], vorrq_u8(vorrq_u8(vld1q_u8(q), vld1q_u8(q + 16)),
                                               vorrq_u8(vld1q_u8(q + 32), vld1q_u8(q + 48))));
        }
    uint8x16_t r = vdupq_n_u8(0);
    for (int s = 0; s < streams; s++) r = veorq_u8(r, acc[s]);
    return vgetq_lane_u64(vreinterpretq_u64_u8(r), 0);
}
static uint64_t read_neon(const char *p, size_t n, int streams, int prefetch) {
    BY_STREAMS(read_neon_body)
}
#endif

static read_fn pick(const char **name) {
#ifdef X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return *name = "avx512", read_avx512;
    if (__builtin_cpu_supports("avx2")) return *name = "avx2", read_avx2;
#elif defined(__aarch64__)
    return *name = "neon", read_neon;
#endif
    return *name = "scalar", read_scalar;
}

/* A pool of workers that wait on a barrier, as the runtime's thread pool does:
 * a timed read starts no threads. */
static struct {
    read_fn fn;
    part parts[MAX_THREADS];
    int threads; /* workers taking part in the current read */
    int quit;
    pthread_barrier_t start, done;
} pool;

static void run_part(part *pt) { pt->sink ^= pool.fn(pt->p, pt->n, pt->streams, pt->prefetch); }

static void *worker(void *arg) {
    const int id = (int)(intptr_t)arg;
    for (;;) {
        pthread_barrier_wait(&pool.start);
        if (pool.quit) return NULL;
        if (id < pool.threads) run_part(&pool.parts[id]);
        pthread_barrier_wait(&pool.done);
    }
}

static double timed_read(const char *buf, size_t n, int threads, int streams, int prefetch) {
    /* at least n bytes in all (the buffers have room past n): never a figure for bytes not read */
    const size_t unit = (size_t)LINE * streams, per = (n / (size_t)threads + unit - 1) / unit * unit;
    for (int i = 0; i < threads; i++)
        pool.parts[i] = (part){buf + per * (size_t)i, per, streams, prefetch, pool.parts[i].sink};
    pool.threads = threads;
    const double t0 = now();
    pthread_barrier_wait(&pool.start);
    run_part(&pool.parts[0]); /* the calling thread is worker 0 */
    pthread_barrier_wait(&pool.done);
    return now() - t0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static char *huge_alloc(size_t n, size_t *size) {
    const size_t huge = (size_t)2 << 20;
    *size = (n + huge - 1) / huge * huge;
    char *p = aligned_alloc(huge, *size);
    if (p) madvise(p, *size, MADV_HUGEPAGE);
    return p;
}

/* The share of the process's anonymous memory in huge pages (the buffers dominate it). */
static double huge_share(size_t bytes) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb * 1024.0 / (double)bytes;
}

/* serve mode: one timed read of the weight bytes per request line "THREADS STREAMS PREFETCH" on
 * stdin, answered with its seconds on stdout, until end of input: a caller times the machine's
 * bandwidth right before and after each of its own measurements. */
static void serve(const char *wb, size_t w, int max_threads) {
    int t, s, pf;
    while (scanf("%d %d %d", &t, &s, &pf) == 3) {
        if (t < 1 || t > max_threads || s < 1 || s > MAX_STREAMS) {
            printf("error\n");
        } else {
            printf("%.9f\n", timed_read(wb, w, t, s, pf));
        }
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    const int serving = argc == 6 && strcmp(argv[5], "serve") == 0;
    if (argc != 5 && !serving) {
        fprintf(stderr, "usage: memory_floor WEIGHT_BYTES KV_BYTES MAX_THREADS ROUNDS [serve]\n");
        return 2;
    }
    const size_t w = (size_t)atof(argv[1]), kv = (size_t)atof(argv[2]);
    const int max_threads = atoi(argv[3]), rounds = atoi(argv[4]);
    if (w < 1 || max_threads < 1 || max_threads > MAX_THREADS || rounds < 1) return 2;
    const char *isa;
    pool.fn = pick(&isa);
    /* Room for the parts' rounding: each thread's share is a multiple of LINE * streams. */
    const size_t slack = (size_t)max_threads * LINE * MAX_STREAMS;
    size_t wsz, ksz;
    char *wb = huge_alloc(w + slack, &wsz), *kb = huge_alloc(kv + slack, &ksz);
    if (!wb || !kb) return 1;
    memset(wb, 1, wsz);
    memset(kb, 1, ksz);
    printf("isa %s\nhugepages %.2f\n", isa, huge_share(wsz + ksz));
    fflush(stdout);   /* serve mode's caller reads these lines before its first request */

    pthread_barrier_init(&pool.start, NULL, (unsigned)max_threads);
    pthread_barrier_init(&pool.done, NULL, (unsigned)max_threads);
    pthread_t th[MAX_THREADS];
    for (int i = 1; i < max_threads; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);

    if (serving) {
        serve(wb, w, max_threads);
        pool.quit = 1;
        pthread_barrier_wait(&pool.start);
        for (int i = 1; i < max_threads; i++) pthread_join(th[i], NULL);
        return 0;
    }
    static const int streams_tried[] = {1, 4, 8};
    enum { N_STREAMS = sizeof streams_tried / sizeof streams_tried[0] };
    int counts[32], n_counts = 0; /* 1, 2, 4, ... below max_threads, then max_threads */
    for (int t = 1; t < max_threads; t *= 2) counts[n_counts++] = t;
    counts[n_counts++] = max_threads;
    const int n_cfg = n_counts * N_STREAMS * 2;
    double *best_w = malloc(sizeof(double) * n_cfg), *best_k = malloc(sizeof(double) * n_cfg);
    double *all_w = malloc(sizeof(double) * n_cfg * 2 * (size_t)rounds);   /* [cfg][round x rep] */
    if (!best_w || !best_k || !all_w) return 1;
    for (int c = 0; c < n_cfg; c++) best_w[c] = best_k[c] = 1e30;
    for (int r = 0; r < rounds; r++)
        for (int c = 0; c < n_cfg; c++) { /* round-robin: the machine's noise hits every configuration alike */
            const int t = counts[c / (N_STREAMS * 2)], s = streams_tried[(c / 2) % N_STREAMS], pf = c % 2;
            for (int rep = 0; rep < 2; rep++) {
                const double tw = timed_read(wb, w, t, s, pf);
                best_w[c] = tw < best_w[c] ? tw : best_w[c];
                all_w[(size_t)c * 2 * rounds + 2 * r + rep] = tw;
            }
            if (kv > 0) {
                const double tk = timed_read(kb, kv, t, s, pf);
                best_k[c] = tk < best_k[c] ? tk : best_k[c];
            } else {
                best_k[c] = 0;
            }
        }
    for (int c = 0; c < n_cfg; c++) {
        double *t = all_w + (size_t)c * 2 * rounds;
        qsort(t, 2 * (size_t)rounds, sizeof *t, cmp_double);
        printf("config %d %d %d %.9f %.9f %.9f\n", counts[c / (N_STREAMS * 2)], streams_tried[(c / 2) % N_STREAMS],
               c % 2, best_w[c], best_k[c], 0.5 * (t[rounds - 1] + t[rounds]));
    }
    pool.quit = 1;
    pthread_barrier_wait(&pool.start);
    for (int i = 1; i < max_threads; i++) pthread_join(th[i], NULL);
    uint64_t sink = 0;
    for (int i = 0; i < max_threads; i++) sink ^= pool.parts[i].sink;
    return sink == 0x5a5a5a5a5a5a5a5aull ? 3 : 0; /* uses the loads' result: the reads cannot be dropped */
}
