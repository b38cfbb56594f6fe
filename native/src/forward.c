/* One forward step over a batch of tokens from any slots: all layers in one call. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "common.h"
#include "packed.h"
#include "recurrent.h"
#include "runtime.h"
#include "state.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Adds the time since *t to stage s and restarts the clock (a few ns per call). */
static inline void lap(ei_runtime *rt, int s, double *t) {
    double n = now_s();
    rt->prof[s] += n - *t;
    *t = n;
}

void ei_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    /* eight partial sums: one serial double chain cost 1.6% of 1B-shape prefill */
    double p[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) p[k] += (double)x[i + k] * x[i + k];
    double ss = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    for (; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
    if (!w) {   /* no weight: Gemma 4's v norm */
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale;
        return;
    }
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void rmsnorm_rows(const ei_runtime *rt, float *out, const float *x, const ei_weight *w, int64_t n_tok) {
    int64_t d = rt->m->cfg.n_embd;
    for (int64_t t = 0; t < n_tok; t++) ei_rmsnorm(out + t * d, x + t * d, w->data, d, rt->m->cfg.rms_eps);
}

/* cos/sin of pos * freq_i (freq_i fixed at creation), in double: positions can be large;
 * both times the attention factor (LongRoPE), as ggml's rope scales them. */
static void rope_fill(const ei_runtime *rt, int half, const double *freq, float *cos_t, float *sin_t,
                      const int32_t *pos, int64_t n_tok) {
    const float af = rt->m->cfg.rope_attn_factor;
    const double m = af > 0 ? (double)af : 1.0;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int i = 0; i < half; i++) {
            const double a = (double)pos[t] * freq[i];
            cos_t[t * half + i] = (float)(cos(a) * m);
            sin_t[t * half + i] = (float)(sin(a) * m);
        }
    }
}

static void rope_tables(ei_runtime *rt, const int32_t *pos, int64_t n_tok) {
    const ei_model_config *c = &rt->m->cfg;
    rope_fill(rt, c->rope_dim / 2, rt->rope_freq, rt->rope_cos, rt->rope_sin, pos, n_tok);
    if (rt->rope_freq_local)
        rope_fill(rt, (c->rope_dim_swa > 0 ? c->rope_dim_swa : c->rope_dim) / 2, rt->rope_freq_local, rt->rope_cos_l,
                  rt->rope_sin_l, pos, n_tok);
}

/* ---- Qwen3 / Gemma 3 ops: per-head Q/K norms, post-norms, embedding scale, softcap ---- */

/* RMSNorm of every q and k head (the layer's head size) with the layer's q_norm / k_norm, and of every
 * v head without a weight (Gemma 4), in place; a KV-shared layer has only q. */
static void qk_norm(const ei_runtime *rt, int l, const ei_layer *L, int64_t n_tok) {
    const ei_model_config *c = &rt->m->cfg;
    const int hd = ei_layer_head_dim(c, l), kv = ei_layer_stores_kv(c, l);
    for (int64_t i = 0; c->has_qk_norm && i < n_tok * c->n_head; i++)
        ei_rmsnorm(rt->q + i * hd, rt->q + i * hd, L->q_norm.data, hd, c->rms_eps);
    for (int64_t i = 0; c->has_qk_norm && kv && i < n_tok * c->n_head_kv; i++)
        ei_rmsnorm(rt->kc + i * hd, rt->kc + i * hd, L->k_norm.data, hd, c->rms_eps);
    for (int64_t i = 0; c->has_v_norm && kv && i < n_tok * c->n_head_kv; i++)
        ei_rmsnorm(rt->vc + i * hd, rt->vc + i * hd, NULL, hd, c->rms_eps);
}

/* A block's output rows y (n_embd wide) through its post-norm, when the model has them. */
static void post_norm(const ei_runtime *rt, float *y, const ei_weight *w, int64_t n_tok) {
    if (rt->m->cfg.has_post_norms) rmsnorm_rows(rt, y, y, w, n_tok);
}

static void softcap(float *x, int64_t n, float cap) {
    if (!(cap > 0)) return;
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

static void rope_head(const ei_model_config *c, int half, float *v, const float *cs, const float *sn) {
    for (int i = 0; i < half; i++) {
        int i0 = c->rope_neox ? i : 2 * i;
        int i1 = c->rope_neox ? i + half : 2 * i + 1;
        float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cs[i] - x1 * sn[i];
        v[i1] = x0 * sn[i] + x1 * cs[i];
    }
}

static void add_bias(float *y, const ei_weight *b, int64_t n_tok, int64_t n) {
    if (!b->data) return;
    const float *bias = b->data;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += bias[i];
}

/* fn(ctx, i) for i in [0, n): on the pool (ei_pool_for), or on the caller when the work
 * is too small to hand out (a decode step). */
static void par_for(ei_runtime *rt, int64_t n, int parallel, void (*fn)(void *, int64_t), void *ctx) {
    if (!parallel || n < 2) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    ei_pool_for(rt->pool, n, fn, ctx);
}

typedef struct {
    ei_runtime *rt;
    int layer;
    int64_t n_tok;
    const int32_t *slots, *pos, *cells;
} kv_task;

/* Item h < n_head: RoPE on query head h of every token; then kv head h - n_head: RoPE
 * on its keys (neither in a layer without RoPE) and both rows of every token into their ring cells, in token order (two
 * tokens of a batch can share a local ring's cell: the later one must win). */
static void store_kv_head(void *raw, int64_t item) {
    const kv_task *k = raw;
    ei_runtime *rt = k->rt;
    const ei_model_config *c = &rt->m->cfg;
    const int hd = ei_layer_head_dim(c, k->layer), half = ei_layer_rope_dim(c, k->layer) / 2;
    const int local = rt->rope_freq_local && ei_layer_is_local(c, k->layer);   /* local layers: their own base */
    const float *cos_t = local ? rt->rope_cos_l : rt->rope_cos, *sin_t = local ? rt->rope_sin_l : rt->rope_sin;
    const int rope = ei_layer_uses_rope(c, k->layer);
    if (item < c->n_head) {
        for (int64_t t = 0; rope && t < k->n_tok; t++)
            rope_head(c, half, rt->q + (t * c->n_head + item) * hd, cos_t + t * half, sin_t + t * half);
        return;
    }
    const int h = (int)(item - c->n_head);
    const int32_t R = ei_layer_in_local_ring(rt, k->layer) ? rt->local_cells : 0;
    for (int64_t t = 0; t < k->n_tok; t++) {
        float *kh = rt->kc + (t * c->n_head_kv + h) * hd, *vh = rt->vc + (t * c->n_head_kv + h) * hd;
        if (rope) rope_head(c, half, kh, cos_t + t * half, sin_t + t * half);
        const int32_t cell = R ? k->pos[t] % R : k->cells[t];   /* the local ring: position mod its size */
        const size_t off = ei_kv_offset(rt, k->slots[t], k->layer, h);
        ei_k_store(rt->kt, rt->p.kv_type, kh, hd, rt->k + off, cell, (int32_t)ei_layer_cells(rt, k->layer));
        ei_kv_store_row(rt->kt, rt->p.kv_type, vh, hd, rt->v + off + (size_t)cell * ei_layer_kv_row_bytes(rt, k->layer));
    }
}

/* RoPE on q and k, then K/V of every token into its ring cell; one head per item (q only in a KV-shared layer). */
static void store_kv(ei_runtime *rt, int layer, int64_t n_tok, const int32_t *slots, const int32_t *pos,
                     const int32_t *cells) {
    const ei_model_config *c = &rt->m->cfg;
    kv_task k = {rt, layer, n_tok, slots, pos, cells};
    par_for(rt, c->n_head + (ei_layer_stores_kv(c, layer) ? c->n_head_kv : 0), n_tok > 1, store_kv_head, &k);
}

/* The ring's bookkeeping for the batch's cells, once per step (before any layer reads it). */
static void record_cells(ei_runtime *rt, int64_t n_tok, const int32_t *slots, const int32_t *pos, const int32_t *cells) {
    for (int64_t t = 0; t < n_tok; t++) {
        size_t cell = (size_t)slots[t] * rt->p.n_ctx + cells[t];
        rt->cell_pos[cell] = pos[t];
        if (rt->n_used[slots[t]] <= cells[t]) rt->n_used[slots[t]] = cells[t] + 1;
        if (rt->local_cells) {
            const int32_t lc = pos[t] % rt->local_cells;
            rt->local_cell_pos[(size_t)slots[t] * rt->local_cells + lc] = pos[t];
            if (rt->local_used[slots[t]] <= lc) rt->local_used[slots[t]] = lc + 1;
        }
    }
}

typedef struct {
    ei_swiglu_fn act;
    float *gate;
    const float *up;
    int64_t n;
} act_task;

enum { ACT_CHUNK = 16384 };

static void act_chunk(void *raw, int64_t i) {
    const act_task *a = raw;
    const int64_t o = i * ACT_CHUNK;
    a->act(a->gate + o, a->up + o, EI_MIN(ACT_CHUNK, a->n - o));
}

/* Attention for tokens [t0, t1) of the batch in one pass over the pool: a
 * partial softmax per (token, kv head, chunk of cells); whichever thread
 * finishes the last chunk of a (token, kv head) merges its heads' partials in
 * chunk order, so the result does not depend on who merges. The tokens go in
 * units of `pair` (1 or 2): a prefill's tokens two at a time, one pass over each
 * chunk's K and V for both. */
typedef struct {
    ei_runtime *rt;
    int layer;
    int64_t t0, t1;
    int32_t n_chunks;
    const int32_t *slots, *pos;
    atomic_llong next;
    /* the layer's: set once by attention() */
    const ei_attn_kernel *kernel;
    int hd, group, ring, pair;
    float scale;
    int32_t n_cells, window, keep_below;
} attn_task;

/* A thread has done n more chunks of (token, kv head); the one finishing its last merges its
 * heads' partials. */
static void merge_if_last(const attn_task *t, int64_t lt, int kvh, int n) {
    ei_runtime *rt = t->rt;
    const ei_model_config *c = &rt->m->cfg;
    const int hd = t->hd, group = t->group, pf = EI_ATTN_PART_FLOATS(hd);
    atomic_int *done = rt->attn_done + lt * c->n_head_kv + kvh;
    if (atomic_fetch_add_explicit(done, n, memory_order_acq_rel) != t->n_chunks - n) return;
    const float *first = rt->attn_part + ((lt * c->n_head_kv + kvh) * t->n_chunks) * group * pf;
    for (int j = 0; j < group; j++)
        ei_attend_merge(first + (int64_t)j * pf, t->n_chunks, (int64_t)group * pf, hd,
                        rt->att + ((t->t0 + lt) * c->n_head + (int64_t)kvh * group + j) * hd);
}

/* One item of an attn_task: a chunk of one (unit of tokens, kv head); returns its number of tokens. */
static int attend_item(const attn_task *t, int64_t item, int ith) {
    ei_runtime *rt = t->rt;
    const ei_model_config *c = &rt->m->cfg;
    const int hd = t->hd, group = t->group, pf = EI_ATTN_PART_FLOATS(hd);
    int32_t *masked = rt->swa_cell_pos ? rt->swa_cell_pos + (size_t)ith * rt->p.n_ctx : NULL;
    float *scores = rt->scores + (size_t)ith * 2 * group * EI_ATTN_CHUNK;
    const int64_t per_unit = (int64_t)c->n_head_kv * t->n_chunks;
    const int64_t lt = item / per_unit * t->pair, tok = t->t0 + lt;   /* the unit's first token */
    const int nt = (int)EI_MIN(t->pair, t->t1 - tok);
    const int kvh = (int)(item % per_unit / t->n_chunks), chunk = (int)(item % t->n_chunks);
    const int slot = t->slots[tok];   /* a unit of two is one slot's */
    /* partials laid out [token][kv head][chunk][head of the group] */
    float *part[2];
    for (int i = 0; i < nt; i++)
        part[i] = rt->attn_part + ((((lt + i) * c->n_head_kv + kvh) * t->n_chunks + chunk) * group) * pf;
    const int32_t c0 = chunk * EI_ATTN_CHUNK,
                  c1 = EI_MIN(c0 + EI_ATTN_CHUNK, t->ring ? rt->local_used[slot] : rt->n_used[slot]);
    if (c0 >= c1) {
        for (int i = 0; i < nt; i++)
            for (int j = 0; j < group; j++) part[i][(int64_t)j * pf] = -INFINITY;
    } else {
        const size_t off = ei_kv_offset(rt, slot, t->layer, kvh);
        const int32_t *cp = t->ring ? rt->local_cell_pos + (size_t)slot * rt->local_cells
                                    : rt->cell_pos + (size_t)slot * rt->p.n_ctx;
        const float *q0 = rt->q + (tok * c->n_head + (int64_t)kvh * group) * hd;
        if (nt == 2) {   /* attention() pairs tokens only where no window masks cells */
            const float *q[2] = {q0, q0 + (int64_t)c->n_head * hd};
            const int32_t pos[2] = {t->pos[tok], t->pos[tok + 1]};
            ei_attend_chunk_pair(t->kernel, q, group, rt->k + off, rt->v + off, cp, c0, c1, t->n_cells, pos, hd,
                                 t->scale, scores, part);
        } else {
            const int32_t lo = t->pos[tok] - t->window, keep_below = t->keep_below;
            if (t->window > 0 && lo >= keep_below) {   /* cells older than the window read as empty */
                for (int32_t cc = c0; cc < c1; cc++) masked[cc] = cp[cc] > lo || cp[cc] < keep_below ? cp[cc] : -1;
                cp = masked;
            }
            ei_attend_chunk(t->kernel, q0, group, rt->k + off, rt->v + off, cp, c0, c1, t->n_cells, t->pos[tok], hd,
                            t->scale, scores, part[0]);
        }
    }
    return nt;
}

/* Items are claimed in runs of consecutive chunks of one arena (at most a (unit, kv head)'s, and
 * about 8 runs a thread or more): a thread then streams on through the arena, its kernel's
 * prefetch running into the chunk it does next. One item a claim sent neighbouring chunks to
 * alternate threads, every chunk starting cold: 1.3x on a decode's attention at depth 4096
 * (2 threads, Zen 4). */
static void attn_chunk_worker(void *raw, int ith, int nth) {
    attn_task *t = raw;
    const int64_t units = (t->t1 - t->t0 + t->pair - 1) / t->pair;
    const int64_t total = units * t->rt->m->cfg.n_head_kv * t->n_chunks;
    const int64_t run = EI_MAX(1, EI_MIN(t->n_chunks, total / ((int64_t)nth * 8)));
    for (;;) {
        const int64_t first = atomic_fetch_add_explicit(&t->next, run, memory_order_relaxed);
        if (first >= total) break;
        const int64_t end = EI_MIN(total, first + run);
        /* one atomic add for the run's chunks of one (unit, kv head), not one a chunk: each add
         * waits for the kernel's stores before it to drain */
        for (int64_t item = first, n = 1; item < end; item++, n++) {
            const int nt = attend_item(t, item, ith);
            if (item + 1 < end && (item + 1) % t->n_chunks) continue;
            const int64_t key = item / t->n_chunks;   /* (unit of tokens, kv head) */
            const int n_kv = t->rt->m->cfg.n_head_kv;
            for (int i = 0; i < nt; i++) merge_if_last(t, key / n_kv * t->pair + i, (int)(key % n_kv), (int)n);
            n = 0;
        }
    }
}

static void attention(ei_runtime *rt, int layer, int64_t n_tok, const int32_t *slots, const int32_t *pos) {
    int32_t used = 0;
    const int ring = ei_layer_in_local_ring(rt, layer);
    for (int64_t i = 0; i < n_tok; i++) used = EI_MAX(used, ring ? rt->local_used[slots[i]] : rt->n_used[slots[i]]);
    const ei_model_config *c = &rt->m->cfg;
    const int hd = ei_layer_head_dim(c, layer), local = ei_layer_is_local(c, layer);
    /* the token's window: a local layer sees its last swa_window positions; a global layer of a
     * ring with slack sees the sinks and its last slide_window positions */
    attn_task t = {.rt = rt, .layer = layer, .slots = slots, .pos = pos,
                   .n_chunks = (used + EI_ATTN_CHUNK - 1) / EI_ATTN_CHUNK,
                   .kernel = hd == c->head_dim ? &rt->attn : &rt->attn_swa, .hd = hd,
                   .group = c->n_head / c->n_head_kv, .ring = ring,
                   .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)hd),
                   .n_cells = (int32_t)ei_layer_cells(rt, ei_layer_kv_source(c, layer)),
                   .window = local ? c->swa_window : rt->p.slide_window, .keep_below = local ? 0 : rt->p.n_sink};
    /* two tokens a unit where the kernel reads a chunk once for both: a batch of one slot's tokens
     * (a prefill) and no window (the window masks cells per token); a batch of many slots keeps
     * one token a unit, so a thread's run of items streams through one arena */
    int one_slot = 1;
    for (int64_t i = 1; i < n_tok; i++) one_slot &= slots[i] == slots[0];
    t.pair = t.kernel->pair && one_slot && t.window <= 0 && n_tok > 1 ? 2 : 1;
    for (int64_t t0 = 0; t0 < n_tok; t0 += rt->attn_tokens) {
        t.t0 = t0;
        t.t1 = EI_MIN(n_tok, t0 + rt->attn_tokens);
        atomic_init(&t.next, 0);
        for (int64_t i = 0; i < (t.t1 - t.t0) * c->n_head_kv; i++) atomic_init(&rt->attn_done[i], 0);
        ei_pool_run(rt->pool, attn_chunk_worker, &t);
    }
}

static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static ei_status embed(ei_runtime *rt, const int32_t *tokens, int64_t n_tok) {
    const ei_weight *e = &rt->m->globals.tok_embd;
    int64_t row = ei_row_bytes(e->type, e->ne0);
    const ei_dequant_fn deq = row ? rt->kt->dequant[e->type] : NULL;
    if (!deq) return ei_fail(EI_ERR_UNSUPPORTED, "no dequantizer for token_embd type %d", e->type);
    for (int64_t t = 0; t < n_tok; t++) {
        const void *src = (const uint8_t *)e->data + row * tokens[t];
        if (rt->embd_row) {   /* tied: the packed head's row, in memory, not the dropped file page */
            ei_unpack_row(rt->kt, e->type, rt->packed[(size_t)rt->m->cfg.n_layer * EI_PACKED_PER_LAYER], e->ne1,
                          e->ne0, tokens[t], rt->embd_row);
            src = rt->embd_row;
        }
        deq(src, rt->x + t * e->ne0, e->ne0);
    }
    const float sc = rt->m->cfg.embd_scale;
    if (sc > 0 && sc != 1.0f)
        for (int64_t i = 0; i < n_tok * e->ne0; i++) rt->x[i] *= sc;
    return EI_OK;
}

static ei_status check_batch(const ei_runtime *rt, int32_t n_tokens, const int32_t *tokens, const int32_t *slots,
                             const int32_t *pos, const int32_t *cells, int32_t n_out, const int32_t *out_rows,
                             const float *logits) {
    if (n_tokens < 1 || n_tokens > rt->p.max_batch)
        return ei_fail(EI_ERR_RANGE, "batch of %d tokens outside [1, max_batch=%d]", n_tokens, rt->p.max_batch);
    if (!tokens || !slots || !pos || !cells) return ei_fail(EI_ERR_INVALID_ARG, "forward: null batch array");
    if (n_out < 0 || n_out > n_tokens || (n_out > 0 && (!out_rows || !logits)))
        return ei_fail(EI_ERR_INVALID_ARG, "forward: bad output rows (n_out=%d)", n_out);
    for (int32_t i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0 || tokens[i] >= rt->m->cfg.n_vocab)
            return ei_fail(EI_ERR_RANGE, "token id %d at batch index %d outside [0, %d)", tokens[i], i,
                           rt->m->cfg.n_vocab);
        if (slots[i] < 0 || slots[i] >= rt->p.n_slots)
            return ei_fail(EI_ERR_RANGE, "slot %d outside [0, %d)", slots[i], rt->p.n_slots);
        if (cells[i] < 0 || cells[i] >= rt->p.n_ctx)
            return ei_fail(EI_ERR_RANGE, "cell %d outside [0, %d)", cells[i], rt->p.n_ctx);
        if (pos[i] < 0) return ei_fail(EI_ERR_RANGE, "position %d is negative", pos[i]);
    }
    for (int32_t j = 0; j < n_out; j++)
        if (out_rows[j] < 0 || out_rows[j] >= n_tokens)
            return ei_fail(EI_ERR_RANGE, "output row %d outside [0, %d)", out_rows[j], n_tokens);
    return EI_OK;
}

/* Gated attention (has_attn_gate): attn_q gave each head's query then its gate; the queries close
 * up into rt->q's [T][q_dim] rows (each moves down, in order) and the gates go to rt->attn_gate. */
static void split_gates(ei_runtime *rt, int64_t T, int64_t qd, int64_t hd) {
    if (!rt->m->cfg.has_attn_gate) return;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < qd / hd; h++) {
            const float *src = rt->q + t * 2 * qd + 2 * h * hd;
            memcpy(rt->attn_gate + t * qd + h * hd, src + hd, (size_t)hd * sizeof(float));
            memmove(rt->q + t * qd + h * hd, src, (size_t)hd * sizeof(float));
        }
}

/* The attention output times sigmoid(gate), before attn_output. */
static void apply_gates(ei_runtime *rt, int64_t n) {
    if (!rt->m->cfg.has_attn_gate) return;
    for (int64_t i = 0; i < n; i++) rt->att[i] /= 1.0f + expf(-rt->attn_gate[i]);
}

/* The attention block on the normed rows rt->xn; its output (before any post-norm) replaces them. */
static void attention_block(ei_runtime *rt, int l, int64_t T, const int32_t *slots, const int32_t *pos,
                            const int32_t *cells, double *t) {
    const ei_model_config *c = &rt->m->cfg;
    const ei_layer *L = &rt->m->layers[l];
    const int64_t hd = ei_layer_head_dim(c, l), qd = (int64_t)c->n_head * hd, kvd = (int64_t)c->n_head_kv * hd;
    const void **pk = rt->packed + (size_t)l * EI_PACKED_PER_LAYER;
    ei_mm_job qkv[3] = {{&L->wq, rt->q, pk[EI_PK_Q]}, {&L->wk, rt->kc, pk[EI_PK_K]}, {&L->wv, rt->vc, pk[EI_PK_V]}};
    ei_parallel_matmul(rt, qkv, ei_layer_stores_kv(c, l) ? 3 : 1, rt->xn, T);   /* a KV-shared layer: q only */
    split_gates(rt, T, qd, hd);
    add_bias(rt->q, &L->bq, T, qd);
    add_bias(rt->kc, &L->bk, T, kvd);
    add_bias(rt->vc, &L->bv, T, kvd);
    qk_norm(rt, l, L, T);
    lap(rt, EI_PROF_QKV, t);
    store_kv(rt, l, T, slots, pos, cells);
    lap(rt, EI_PROF_ROPE_KV, t);

    attention(rt, l, T, slots, pos);
    apply_gates(rt, T * qd);
    lap(rt, EI_PROF_ATTENTION, t);

    ei_mm_job o = {&L->wo, rt->xn, pk[EI_PK_O]};
    ei_parallel_matmul(rt, &o, 1, rt->att, T);
}

/* Does a slot of the batch have LoRA adapters attached? */
static int batch_has_loras(const ei_runtime *rt, const int32_t *slots, int64_t n_tok) {
    for (int64_t t = 0; rt->slot_lora && t < n_tok; t++)
        if (rt->slot_lora[slots[t]].n) return 1;
    return 0;
}

static ei_status lora_done(ei_runtime *rt) {
    rt->lora_slots = NULL;
    return EI_OK;
}

/* An MTP block's input (ei_forward_nextn): row t of rt->x (its token's embedding) through enorm and
 * the trunk's hidden row t through hnorm, side by side ([embedding; hidden], as vLLM's
 * qwen3_next_mtp.py concatenates them), through eh_proj back into rt->x. */
static void nextn_input(ei_runtime *rt, const float *hidden, int64_t T) {
    const ei_model *m = rt->m;
    const int64_t d = m->cfg.n_embd;
    for (int64_t t = 0; t < T; t++) {
        ei_rmsnorm(rt->nextn_in + t * 2 * d, rt->x + t * d, m->nextn_enorm.data, d, m->cfg.rms_eps);
        ei_rmsnorm(rt->nextn_in + t * 2 * d + d, hidden + t * d, m->nextn_hnorm.data, d, m->cfg.rms_eps);
    }
    ei_mm_job fc = {&m->nextn_eh_proj, rt->x, NULL};
    ei_matmul_base(rt, &fc, 1, rt->nextn_in, T);   /* no adapter touches the MTP block */
}

/* hidden: out gets each output row's final-normed hidden state (n_embd floats) instead of its logits.
 * nextn_h (an MTP block's model): the trunk's hidden rows its input combines with the tokens;
 * hidden_out: also each output row's final-normed state, beside its logits. */
static ei_status forward(ei_runtime *rt, int32_t n_tokens, const int32_t *tokens, const int32_t *slots,
                         const int32_t *pos, const int32_t *cells, int32_t n_out, const int32_t *out_rows,
                         float *logits, int hidden, int32_t n_keep, const int32_t *keep_rows,
                         const float *nextn_h, float *hidden_out) {
    if (!rt) return ei_fail(EI_ERR_INVALID_ARG, "forward: null runtime");
    rt->last_n = 0;
    ei_status st = check_batch(rt, n_tokens, tokens, slots, pos, cells, n_out, out_rows, logits);
    if (st != EI_OK) return st;
    if ((st = ei_state_begin(rt, n_tokens, slots, pos, n_keep, keep_rows)) != EI_OK) return st;
    const ei_model *m = rt->m;
    const ei_model_config *c = &m->cfg;
    int64_t T = n_tokens, d = c->n_embd;

    rt->lora_slots = batch_has_loras(rt, slots, T) ? slots : NULL;
    double t = now_s();
    if ((st = embed(rt, tokens, T)) != EI_OK || (st = ei_per_layer_inputs(rt, tokens, T)) != EI_OK) return st;
    if (nextn_h) nextn_input(rt, nextn_h, T);
    rope_tables(rt, pos, T);
    record_cells(rt, T, slots, pos, cells);
    lap(rt, EI_PROF_EMBED, &t);
    for (int l = 0; l < c->n_layer; l++) {
        const ei_layer *L = &m->layers[l];
        rmsnorm_rows(rt, rt->xn, rt->x, &L->attn_norm, T);
        lap(rt, EI_PROF_NORM, &t);
        const void **pk = rt->packed + (size_t)l * EI_PACKED_PER_LAYER;
        switch (ei_layer_kind_of(c, l)) {
        case EI_LAYER_SHORTCONV: ei_shortconv_layer(rt, l, T, slots); lap(rt, EI_PROF_RECURRENT, &t); break;
        case EI_LAYER_DELTANET: ei_deltanet_layer(rt, l, T, slots); lap(rt, EI_PROF_RECURRENT, &t); break;
        default: attention_block(rt, l, T, slots, pos, cells, &t); break;
        }
        post_norm(rt, rt->xn, &L->attn_post_norm, T);
        add_into(rt->x, rt->xn, T * d);
        lap(rt, EI_PROF_ATTN_OUT, &t);

        rmsnorm_rows(rt, rt->xn, rt->x, &L->ffn_norm, T);
        lap(rt, EI_PROF_NORM, &t);
        ei_mm_job gu[2] = {{&L->w_gate, rt->gate, pk[EI_PK_GATE]}, {&L->w_up, rt->up, pk[EI_PK_UP]}};
        ei_parallel_matmul(rt, gu, 2, rt->xn, T);
        lap(rt, EI_PROF_FFN_UP, &t);
        act_task act = {c->act_gelu ? rt->kt->geglu : rt->kt->swiglu, rt->gate, rt->up, T * ei_layer_n_ff(c, l)};
        par_for(rt, (act.n + ACT_CHUNK - 1) / ACT_CHUNK, 1, act_chunk, &act);
        lap(rt, EI_PROF_FFN_ACT, &t);
        ei_mm_job down = {&L->w_down, rt->xn, pk[EI_PK_DOWN]};
        ei_parallel_matmul(rt, &down, 1, rt->gate, T);
        post_norm(rt, rt->xn, &L->ffn_post_norm, T);
        add_into(rt->x, rt->xn, T * d);
        ei_per_layer_block(rt, l, T);   /* Gemma 4: per-layer input, output scale */
        lap(rt, EI_PROF_FFN_DOWN, &t);
    }
    ei_state_end(rt, n_tokens, slots, pos);
    rt->last_n = n_tokens;
    if (n_out == 0) return lora_done(rt);
    float *normed = hidden ? logits : rt->out_rows;
    for (int32_t j = 0; j < n_out; j++)
        ei_rmsnorm(normed + (int64_t)j * d, rt->x + (int64_t)out_rows[j] * d, m->globals.output_norm.data, d, c->rms_eps);
    if (hidden) return lora_done(rt);
    if (rt->lora_slots) {
        for (int32_t j = 0; j < n_out; j++) rt->lora_head_slots[j] = slots[out_rows[j]];
        rt->lora_slots = rt->lora_head_slots;
    }
    ei_mm_job head = {ei_model_output(m), logits, rt->packed[(size_t)c->n_layer * EI_PACKED_PER_LAYER]};
    ei_parallel_matmul(rt, &head, 1, rt->out_rows, n_out);
    softcap(logits, (int64_t)n_out * c->n_vocab, c->final_softcap);
    if (hidden_out) memcpy(hidden_out, rt->out_rows, (size_t)n_out * d * sizeof(float));
    lap(rt, EI_PROF_HEAD, &t);
    return lora_done(rt);
}

ei_status ei_forward(ei_runtime *rt, int32_t n_tokens, const int32_t *tokens, const int32_t *slots,
                     const int32_t *pos, const int32_t *cells, int32_t n_out, const int32_t *out_rows,
                     float *logits, int32_t n_keep, const int32_t *keep_rows) {
    return forward(rt, n_tokens, tokens, slots, pos, cells, n_out, out_rows, logits, 0, n_keep, keep_rows, NULL, NULL);
}

ei_status ei_forward_hidden(ei_runtime *rt, int32_t n_tokens, const int32_t *tokens, const int32_t *slots,
                            const int32_t *pos, const int32_t *cells, int32_t n_out, const int32_t *out_rows,
                            float *hidden, int32_t n_keep, const int32_t *keep_rows) {
    return forward(rt, n_tokens, tokens, slots, pos, cells, n_out, out_rows, hidden, 1, n_keep, keep_rows, NULL, NULL);
}

ei_status ei_forward_nextn(ei_runtime *rt, int32_t n_tokens, const int32_t *tokens, const float *hidden_in,
                           const int32_t *slots, const int32_t *pos, const int32_t *cells,
                           int32_t n_out, const int32_t *out_rows, float *logits, float *hidden_out) {
    if (!rt) return ei_fail(EI_ERR_INVALID_ARG, "forward_nextn: null runtime");
    if (!rt->nextn_in) return ei_fail(EI_ERR_STATE, "forward_nextn: the model has no MTP block input tensors");
    if (!hidden_in) return ei_fail(EI_ERR_INVALID_ARG, "forward_nextn: null hidden rows");
    return forward(rt, n_tokens, tokens, slots, pos, cells, n_out, out_rows, logits, 0, 0, NULL, hidden_in,
                   hidden_out);
}

ei_status ei_runtime_last_hidden(const ei_runtime *rt, int32_t n_rows, const int32_t *rows, float *out) {
    if (!rt || (n_rows > 0 && (!rows || !out))) return ei_fail(EI_ERR_INVALID_ARG, "last_hidden: null argument");
    if (n_rows < 0) return ei_fail(EI_ERR_INVALID_ARG, "last_hidden: %d rows", n_rows);
    const ei_model_config *c = &rt->m->cfg;
    const int64_t d = c->n_embd;
    for (int32_t j = 0; j < n_rows; j++) {
        if (rows[j] < 0 || rows[j] >= rt->last_n)
            return ei_fail(EI_ERR_RANGE, "last_hidden: row %d outside the latest forward's [0, %d)", rows[j], rt->last_n);
        ei_rmsnorm(out + j * d, rt->x + (int64_t)rows[j] * d, rt->m->globals.output_norm.data, d, c->rms_eps);
    }
    return EI_OK;
}
