/* The model: configuration plus weight views into caller-owned memory. */
#ifndef EI_MODEL_H
#define EI_MODEL_H
#include "edgeinfer.h"

typedef struct {
    const void *data;   /* NULL when absent */
    int type;
    int64_t ne0, ne1;   /* ne0 = row length, ne1 = rows */
} ei_weight;

typedef struct {
    ei_weight attn_norm, wq, wk, wv, bq, bk, bv, wo, ffn_norm, w_gate, w_up, w_down;
    ei_weight q_norm, k_norm, attn_post_norm, ffn_post_norm;   /* Qwen3 / Gemma 3; data NULL when absent */
} ei_layer;

struct ei_model {
    ei_model_config cfg;
    ei_weight tok_embd, output_norm, output, rope_freqs;
    ei_layer *layers;
    int finalized;
};

/* Is layer l a sliding-window (local) layer? Global iff (l + 1) % swa_pattern == 0, as llama.cpp
 * and transformers lay out Gemma 3 (5 local : 1 global for a pattern of 6). */
static inline int ei_layer_is_local(const ei_model_config *c, int l) {
    return c->swa_window > 0 && (c->swa_pattern == 0 || (l + 1) % c->swa_pattern != 0);
}

/* The output head: `output` when present, else the tied token embedding. */
const ei_weight *ei_model_output(const ei_model *m);
#endif
