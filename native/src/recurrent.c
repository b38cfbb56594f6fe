/* The recurrent layers' forward (runtime.h, state.h): a slot's tokens update its fixed-size
 * state in order; after a keep row the state is copied for ei_runtime_restore_state. */
#include "recurrent.h"

#include <math.h>

#include "common.h"
#include "threadpool.h"
#include "state.h"

/* Runs of rows [i, j] of one slot, cut after each keep row so its state can be copied there. */
static int64_t run_end(const ei_runtime *rt, int64_t i, int64_t n_tok, const int32_t *slots) {
    int64_t j = i;
    while (j + 1 < n_tok && slots[j + 1] == slots[i] && rt->keep_snap[j] < 0) j++;
    return j;
}

/* LFM2's gated short convolution on the normed rows rt->xn; its output replaces them.
 * in_proj -> B, C, x; y = C * conv(B * x) over each slot's window; out_proj. */
void ei_shortconv_layer(ei_runtime *rt, int l, int64_t n_tok, const int32_t *slots) {
    const ei_model_config *c = &rt->m->cfg;
    const ei_layer *L = &rt->m->layers[l];
    const int64_t d = c->n_embd;
    const void **pk = rt->packed + (size_t)l * EI_PACKED_PER_LAYER;
    float *bcx = rt->rec_a, *bx = rt->rec_b, *y = rt->rec_b + (size_t)rt->p.max_batch * d;
    ei_mm_job in = {&L->shortconv_in, bcx, pk[EI_PK_Q]};
    ei_parallel_matmul(rt, &in, 1, rt->xn, n_tok);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < d; i++) bx[t * d + i] = bcx[t * 3 * d + i] * bcx[t * 3 * d + 2 * d + i];
    for (int64_t i = 0; i < n_tok;) {
        const int64_t j = run_end(rt, i, n_tok, slots);
        rt->kt->conv1d(rt->conv_taps[l], c->conv_kernel, d, ei_state_of(rt, slots[i], l), bx + i * d, j - i + 1, y + i * d);
        ei_state_keep_row(rt, l, slots[j], j);
        i = j + 1;
    }
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < d; i++) y[t * d + i] *= bcx[t * 3 * d + d + i];
    ei_mm_job out = {&L->shortconv_out, rt->xn, pk[EI_PK_O]};
    ei_parallel_matmul(rt, &out, 1, y, n_tok);
}

/* ---- Qwen3.5's Gated DeltaNet (edgeinfer/arch/deltanet.py) ---- */

static const float L2_EPS = 1e-6f;   /* transformers' l2norm of q and k */

/* rt->dn_buf: qkv and its conv [2][B][conv_dim], z and o [2][B][inner], alpha and beta [2][B][v heads],
 * then one delta-rule scratch per value head. */
int64_t ei_deltanet_scratch_floats(const ei_runtime *rt) {
    const ei_model_config *c = &rt->m->cfg;
    if (!c->ssm_head_dim) return 0;
    const int64_t B = rt->p.max_batch;
    return B * (2 * ei_deltanet_conv_dim(c) + 2 * ei_deltanet_inner(c) + 2 * c->ssm_v_heads) +
           c->ssm_v_heads * ei_delta_scratch_floats(EI_DELTA_CHUNK, c->ssm_head_dim, c->ssm_head_dim);
}

typedef struct {
    const ei_runtime *rt;
    ei_delta_head head;   /* head 0's; head h moves q, k, v, g, beta, o and state along */
    int chunk;
    float *scratch;
} delta_task;

static void delta_head(void *raw, int64_t h) {
    const delta_task *t = raw;
    const ei_model_config *c = &t->rt->m->cfg;
    const int64_t d = c->ssm_head_dim, kh = h % c->ssm_k_heads;   /* tiled value heads */
    ei_delta_head a = t->head;
    a.q += kh * d, a.k += kh * d, a.v += h * d, a.g += h, a.beta += h, a.o += h * d, a.state += h * d * d;
    (t->chunk ? t->rt->kt->delta_chunked : t->rt->kt->delta_step)(&a, t->chunk,
                                                                  t->scratch + h * ei_delta_scratch_floats(EI_DELTA_CHUNK, (int)d, (int)d));
}

static float softplus1(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void ei_deltanet_layer(ei_runtime *rt, int l, int64_t n_tok, const int32_t *slots) {
    const ei_model_config *c = &rt->m->cfg;
    const ei_layer *L = &rt->m->layers[l];
    const int64_t B = rt->p.max_batch, d = c->ssm_head_dim, nk = c->ssm_k_heads, nv = c->ssm_v_heads;
    const int64_t cd = ei_deltanet_conv_dim(c), inner = ei_deltanet_inner(c), K = c->conv_kernel;
    float *qkv = rt->dn_buf, *y = qkv + B * cd, *z = y + B * cd, *o = z + B * inner;
    float *alpha = o + B * inner, *beta = alpha + B * nv, *scratch = beta + B * nv;
    const void **pk = rt->packed + (size_t)l * EI_PACKED_PER_LAYER;
    ei_mm_job in[4] = {{&L->ssm_qkv, qkv, pk[EI_PK_Q]}, {&L->ssm_gate, z, pk[EI_PK_K]}, {&L->ssm_alpha, alpha, NULL},
                       {&L->ssm_beta, beta, NULL}};
    ei_parallel_matmul(rt, in, 3, rt->xn, n_tok);
    ei_parallel_matmul(rt, in + 3, 1, rt->xn, n_tok);
    const float *a_neg = L->ssm_a.data, *dt = L->ssm_dt.data;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t h = 0; h < nv; h++) {   /* alpha -> the log decay g, beta -> sigmoid(beta) */
            alpha[t * nv + h] = a_neg[h] * softplus1(alpha[t * nv + h] + dt[h]);
            beta[t * nv + h] = 1.0f / (1.0f + expf(-beta[t * nv + h]));
        }
    for (int64_t i = 0; i < n_tok;) {
        const int64_t j = run_end(rt, i, n_tok, slots), n = j - i + 1;
        float *st = ei_state_of(rt, slots[i], l);
        rt->kt->conv1d(rt->conv_taps[l], (int)K, cd, st, qkv + i * cd, n, y + i * cd);
        for (int64_t e = i * cd; e < (j + 1) * cd; e++) y[e] = y[e] / (1.0f + expf(-y[e]));
        for (int64_t t = i; t <= j; t++) {
            rt->kt->l2norm(y + t * cd, nk, d, L2_EPS, 1.0f / sqrtf((float)d));
            rt->kt->l2norm(y + t * cd + nk * d, nk, d, L2_EPS, 1.0f);
        }
        delta_task task = {rt,
                           {.q = y + i * cd, .k = y + i * cd + nk * d, .v = y + i * cd + 2 * nk * d, .g = alpha + i * nv,
                            .beta = beta + i * nv, .o = o + i * inner, .state = st + (K - 1) * cd, .ld_qk = cd,
                            .ld_v = cd, .ld_gb = nv, .ld_o = inner, .n_tok = n, .dk = (int)d, .dv = (int)d},
                           n >= EI_DELTA_CHUNK ? EI_DELTA_CHUNK : 0, scratch};
        if (nv > 1) ei_pool_for(rt->pool, nv, delta_head, &task);
        else delta_head(&task, 0);
        ei_state_keep_row(rt, l, slots[j], j);
        i = j + 1;
    }
    rt->kt->gated_norm(o, L->ssm_norm.data, z, n_tok * nv, d, c->rms_eps);
    ei_mm_job out = {&L->ssm_out, rt->xn, pk[EI_PK_O]};
    ei_parallel_matmul(rt, &out, 1, o, n_tok);
}
