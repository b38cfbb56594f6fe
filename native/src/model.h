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
} ei_layer;

struct ei_model {
    ei_model_config cfg;
    ei_weight tok_embd, output_norm, output, rope_freqs;
    ei_layer *layers;
    int finalized;
};

/* The output head: `output` when present, else the tied token embedding. */
const ei_weight *ei_model_output(const ei_model *m);
#endif
