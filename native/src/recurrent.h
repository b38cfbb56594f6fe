/* The recurrent layers' forward (recurrent.c): each reads the normed rows rt->xn and leaves
 * its block's output there, as the attention block does. */
#ifndef EI_RECURRENT_H
#define EI_RECURRENT_H
#include "runtime.h"

void ei_shortconv_layer(ei_runtime *rt, int l, int64_t n_tok, const int32_t *slots);
#endif
