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
};

/* The output head: `output` when present, else the tied token embedding. */
const ei_weight *ei_model_output(const ei_model *m);
#endif
