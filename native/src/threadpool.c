#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* Spins this many rounds before yielding, and yields this many times before
 * sleeping on the condition variable. */
enum { SPIN_ROUNDS = 2000, YIELD_ROUNDS = 2000 };
#define TASK_CLOSED ((uint64_t)1 << 31)
#define TASK_COUNT ((uint64_t)TASK_CLOSED - 1)


struct ei_pool {
    int n;
    pthread_t *threads;
    ei_task_fn fn;
    void *ctx;
    atomic_uint generation;
    /* generation << 32 | CLOSED | threads inside the task */
    _Atomic uint64_t task;
    atomic_int stop;
    atomic_int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Enters the task of generation gen unless it is closed or already replaced. */
static int join_task(ei_pool *p, unsigned gen) {
    uint64_t cur = atomic_load(&p->task);
    for (;;) {
        if ((cur >> 32) != gen || (cur & TASK_CLOSED)) return 0;
        if (atomic_compare_exchange_weak(&p->task, &cur, cur + 1)) return 1;
    }
}

typedef struct {
    ei_pool *pool;
    int ith;
} worker_arg;

static void *worker_main(void *raw) {
    worker_arg arg = *(worker_arg *)raw;
    free(raw);
    ei_pool *p = arg.pool;
    /* Generation 0 is the state at creation: a dispatch may bump it before this thread runs. */
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int rounds = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
            if (atomic_load(&p->stop)) return NULL;
            if (rounds < SPIN_ROUNDS) {
                CPU_RELAX();
            } else if (rounds < SPIN_ROUNDS + YIELD_ROUNDS) {
                sched_yield();
            } else {
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleepers, 1);
                while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                    pthread_cond_wait(&p->cv, &p->mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->mu);
            }
            rounds++;
        }
        seen = gen;
        if (atomic_load(&p->stop)) return NULL;
        if (!join_task(p, gen)) continue;   /* too late: the caller finished without us */
        p->fn(p->ctx, arg.ith, p->n);
        atomic_fetch_sub_explicit(&p->task, 1, memory_order_release);
    }
}

ei_pool *ei_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    ei_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) { free(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg) { p->n = i; ei_pool_free(p); return NULL; }
        arg->pool = p;
        arg->ith = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, arg) != 0) {
            free(arg);
            p->n = i;
            ei_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void ei_pool_free(ei_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int ei_pool_size(const ei_pool *p) { return p->n; }

typedef struct {
    void (*fn)(void *ctx, int64_t i);
    void *ctx;
    int64_t n;
    _Atomic int64_t next;
} for_task;

static void for_worker(void *raw, int ith, int nth) {
    (void)ith, (void)nth;
    for_task *t = raw;
    for (int64_t i; (i = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed)) < t->n;) t->fn(t->ctx, i);
}

void ei_pool_for(ei_pool *p, int64_t n, void (*fn)(void *ctx, int64_t i), void *ctx) {
    for_task t = {.fn = fn, .ctx = ctx, .n = n};
    atomic_init(&t.next, 0);
    ei_pool_run(p, for_worker, &t);
}

void ei_pool_run(ei_pool *p, ei_task_fn fn, void *ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    const unsigned gen = atomic_load(&p->generation) + 1;
    atomic_store(&p->task, (uint64_t)gen << 32);
    atomic_store_explicit(&p->generation, gen, memory_order_release);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    /* Close the task: no worker joins from now on; wait for those inside. */
    atomic_fetch_or(&p->task, TASK_CLOSED);
    int rounds = 0;
    while (atomic_load_explicit(&p->task, memory_order_acquire) & TASK_COUNT) {
        if (++rounds < SPIN_ROUNDS) CPU_RELAX(); else sched_yield();
    }
}
