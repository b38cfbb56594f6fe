/* The recurrent layers' forward (runtime.h, state.h): a slot's tokens update its fixed-size
 * state in order; after a keep row the state is copied for ei_runtime_restore_state. */
#include "recurrent.h"

#include "common.h"
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
