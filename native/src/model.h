/* The model: configuration plus weight views into caller-owned memory. */
#ifndef EI_MODEL_H
#define EI_MODEL_H
#include "edgeinfer.h"
#include "edgeinfer_layout.h"   /* ei_weight, ei_globals, ei_layer, ei_layer_is_local */

struct ei_model {
    ei_model_config cfg;
    ei_globals globals;
    ei_layer *layers;
    int finalized;
    /* Qwen3.5's MTP block run as a one-layer model (engine/mtp.py): eh_proj [n_embd rows of 2 n_embd],
     * the embedding's and the trunk hidden's pre-norms (F32); NULL data without. head_rt: the trunk's
     * runtime whose packed output head this model's runtimes read (no second packed copy). */
    ei_weight nextn_eh_proj, nextn_enorm, nextn_hnorm;
    const struct ei_runtime *head_rt;
};

/* The output head: `output` when present, else the tied token embedding. */
const ei_weight *ei_model_output(const ei_model *m);
#endif
