/* A small persistent thread pool: one dispatch runs fn(ctx, ith, nth) on the
 * caller (ith 0) and on whichever workers join in time, and returns when every
 * thread that joined has finished. Workers spin briefly between dispatches (a
 * decode step issues a few hundred) and sleep when idle.
 *
 * fn must share its work dynamically (an atomic counter of chunks): a worker
 * that is descheduled may join late and find nothing left, or not join at all,
 * and the caller then does the work itself instead of waiting for it. On a
 * busy machine a step degrades to one thread's speed instead of stalling. */
#ifndef EI_THREADPOOL_H
#define EI_THREADPOOL_H
#include <stdint.h>

typedef void (*ei_task_fn)(void *ctx, int ith, int nth);
typedef struct ei_pool ei_pool;

ei_pool *ei_pool_create(int n_threads);   /* NULL on failure */
void ei_pool_free(ei_pool *p);
int ei_pool_size(const ei_pool *p);
void ei_pool_run(ei_pool *p, ei_task_fn fn, void *ctx);

/* fn(ctx, i) for i in [0, n) on the pool, the items handed out by an atomic counter (a
 * worker that joins late finds them taken). */
void ei_pool_for(ei_pool *p, int64_t n, void (*fn)(void *ctx, int64_t i), void *ctx);
#endif
