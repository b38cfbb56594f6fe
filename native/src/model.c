#include "model.h"

#include <stdlib.h>

#include "common.h"
#include "kernels.h"

ei_status ei_model_create(const ei_model_config *cfg, ei_model **out) {
    if (!cfg || !out) return ei_fail(EI_ERR_INVALID_ARG, "model_create: null argument");
    *out = NULL;
    char msg[256];
    const ei_status st = ei_config_check(cfg, msg, sizeof msg);
    if (st != EI_OK) return ei_fail(st, "%s", msg);
    ei_model *m = calloc(1, sizeof *m);
    if (!m) return ei_fail(EI_ERR_OUT_OF_MEMORY, "model_create: out of memory");
    m->layers = calloc((size_t)cfg->n_layer, sizeof(ei_layer));
    if (!m->layers) { free(m); return ei_fail(EI_ERR_OUT_OF_MEMORY, "model_create: out of memory"); }
    m->cfg = *cfg;
    *out = m;
    return EI_OK;
}

ei_status ei_model_set_tensor(ei_model *m, int layer, int role, const void *data, int type,
                              int64_t ne0, int64_t ne1) {
    if (!m || !data) return ei_fail(EI_ERR_INVALID_ARG, "set_tensor: null argument");
    if (m->finalized) return ei_fail(EI_ERR_STATE, "set_tensor: model already finalized");
    ei_weight *w = ei_weight_slot(&m->globals, m->layers, m->cfg.n_layer, layer, role);
    if (!w) return ei_fail(EI_ERR_INVALID_ARG, "set_tensor: no tensor role %d for layer %d", role, layer);
    int64_t want0, want1;
    if (ei_role_expect(&m->cfg, role, layer, &want0, &want1) == EI_MUST_BE_ABSENT)
        return ei_fail(EI_ERR_INVALID_ARG, "set_tensor: role %d for a model configured without it", role);
    if (ne0 < 1 || ne1 < 1 || ne0 > (int64_t)1 << 32 || ne1 > (int64_t)1 << 32)
        return ei_fail(EI_ERR_INVALID_ARG, "set_tensor: bad shape [%lld, %lld]", (long long)ne0, (long long)ne1);
    if (ei_row_bytes(type, ne0) <= 0)
        return ei_fail(EI_ERR_UNSUPPORTED, "set_tensor: type %d cannot hold rows of %lld", type, (long long)ne0);
    w->data = data;
    w->type = type;
    w->ne0 = ne0;
    w->ne1 = ne1;
    return EI_OK;
}

ei_status ei_model_finalize(ei_model *m) {
    if (!m) return ei_fail(EI_ERR_INVALID_ARG, "finalize: null model");
    char msg[256];
    const ei_status st = ei_layout_check(&m->cfg, &m->globals, m->layers, msg, sizeof msg);
    if (st != EI_OK) return ei_fail(st, "%s", msg);
    m->finalized = 1;
    return EI_OK;
}

void ei_model_free(ei_model *m) {
    if (!m) return;
    free(m->layers);
    free(m);
}

const ei_weight *ei_model_output(const ei_model *m) {
    return m->globals.output.data ? &m->globals.output : &m->globals.tok_embd;
}
