/* Gemma 4's per-layer inputs: a second, narrow embedding per layer (per_layer_token_embd, read a row a
 * token from the file's mapping, never copied whole) plus a projection of the scaled token embedding,
 *   ple[t][l] = (rmsnorm(x[t] W_proj / sqrt(n_embd))[l] + tok_row[l] * sqrt(e)) / sqrt(2),
 * and after each layer's FFN
 *   x += post_norm(proj(gelu(inp_gate(x)) * ple[t][l])),  then x *= the layer's output scale. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "runtime.h"

static float *alloc_floats(size_t n, size_t *total) {
    *total += n * sizeof(float);
    return calloc(n ? n : 1, sizeof(float));
}

int ei_per_layer_alloc(ei_runtime *rt, size_t *scratch) {
    const ei_model_config *c = &rt->m->cfg;
    if (c->n_embd_per_layer <= 0) return 0;
    const size_t B = (size_t)rt->p.max_batch, e = (size_t)c->n_embd_per_layer, all = e * (size_t)c->n_layer;
    rt->ple = alloc_floats(B * all, scratch);
    rt->ple_gate = alloc_floats(B * e, scratch);
    rt->ple_in = alloc_floats(EI_MAX(B * e, all), scratch);   /* also one token's row of the table */
    return !rt->ple || !rt->ple_gate || !rt->ple_in;
}

ei_status ei_per_layer_inputs(ei_runtime *rt, const int32_t *tokens, int64_t n_tok) {
    const ei_model_config *c = &rt->m->cfg;
    if (c->n_embd_per_layer <= 0) return EI_OK;
    const ei_globals *g = &rt->m->globals;
    const int64_t e = c->n_embd_per_layer, all = e * c->n_layer;
    const ei_weight *tab = &g->ple_tok_embd;
    const int64_t row = ei_row_bytes(tab->type, tab->ne0);
    const ei_dequant_fn deq = row ? rt->kt->dequant[tab->type] : NULL;
    if (!deq) return ei_fail(EI_ERR_UNSUPPORTED, "no dequantizer for per_layer_token_embd type %d", tab->type);
    ei_mm_job proj = {&g->ple_model_proj, rt->ple, NULL};
    ei_parallel_matmul(rt, &proj, 1, rt->x, n_tok);
    const float to_x = 1.0f / sqrtf((float)c->n_embd), to_tok = sqrtf((float)e), half = 1.0f / sqrtf(2.0f);
    for (int64_t t = 0; t < n_tok; t++) {
        float *p = rt->ple + t * all;
        deq((const uint8_t *)tab->data + row * tokens[t], rt->ple_in, all);
        for (int64_t i = 0; i < all; i++) p[i] *= to_x;
        for (int l = 0; l < c->n_layer; l++) ei_rmsnorm(p + l * e, p + l * e, g->ple_proj_norm.data, e, c->rms_eps);
        for (int64_t i = 0; i < all; i++) p[i] = (p[i] + rt->ple_in[i] * to_tok) * half;
    }
    return EI_OK;
}

void ei_per_layer_block(ei_runtime *rt, int l, int64_t n_tok) {
    const ei_model_config *c = &rt->m->cfg;
    const ei_layer *L = &rt->m->layers[l];
    const int64_t d = c->n_embd, e = c->n_embd_per_layer;
    if (e > 0) {
        ei_mm_job gate = {&L->ple_inp_gate, rt->ple_gate, NULL};
        ei_parallel_matmul(rt, &gate, 1, rt->x, n_tok);
        for (int64_t t = 0; t < n_tok; t++)
            memcpy(rt->ple_in + t * e, rt->ple + (t * c->n_layer + l) * e, (size_t)e * sizeof(float));
        rt->kt->geglu(rt->ple_gate, rt->ple_in, n_tok * e);
        ei_mm_job proj = {&L->ple_proj, rt->xn, NULL};
        ei_parallel_matmul(rt, &proj, 1, rt->ple_gate, n_tok);
        for (int64_t t = 0; t < n_tok; t++) {
            float *y = rt->xn + t * d, *x = rt->x + t * d;
            ei_rmsnorm(y, y, L->ple_post_norm.data, d, c->rms_eps);
            for (int64_t i = 0; i < d; i++) x[i] += y[i];
        }
    }
    if (L->out_scale.data) {
        const float s = *(const float *)L->out_scale.data;
        for (int64_t i = 0; i < n_tok * d; i++) rt->x[i] *= s;
    }
}
