/* The recurrent layers' forward (recurrent.c): each reads the normed rows rt->xn and leaves
 * its block's output there, as the attention block does. */
#ifndef EI_RECURRENT_H
#define EI_RECURRENT_H
#include "runtime.h"

void ei_shortconv_layer(ei_runtime *rt, int l, int64_t n_tok, const int32_t *slots);

/* Qwen3.5's Gated DeltaNet token mixer; its scratch (rt->dn_buf) is ei_deltanet_scratch_floats(rt)
 * floats, 0 without delta-net layers. */
void ei_deltanet_layer(ei_runtime *rt, int l, int64_t n_tok, const int32_t *slots);
int64_t ei_deltanet_scratch_floats(const ei_runtime *rt);
#endif
