/* A small persistent thread pool: one dispatch runs fn(ctx, ith, nth) on every
 * thread (the caller is thread 0) and returns when all are done. Workers spin
 * briefly between dispatches (a decode step issues a few hundred) and sleep
 * when idle, so an idle engine burns no CPU. */
#ifndef EI_THREADPOOL_H
#define EI_THREADPOOL_H

typedef void (*ei_task_fn)(void *ctx, int ith, int nth);
typedef struct ei_pool ei_pool;

ei_pool *ei_pool_create(int n_threads);   /* NULL on failure */
void ei_pool_free(ei_pool *p);
int ei_pool_size(const ei_pool *p);
void ei_pool_run(ei_pool *p, ei_task_fn fn, void *ctx);
#endif
