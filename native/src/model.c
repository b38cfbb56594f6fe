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

ei_status ei_model_set_nextn(ei_model *m, int which, const void *data, int type, int64_t ne0, int64_t ne1) {
    if (!m || !data) return ei_fail(EI_ERR_INVALID_ARG, "set_nextn: null argument");
    if (m->finalized) return ei_fail(EI_ERR_STATE, "set_nextn: model already finalized");
    const int64_t d = m->cfg.n_embd;
    ei_weight *w = which == EI_NEXTN_EH_PROJ ? &m->nextn_eh_proj : which == EI_NEXTN_ENORM ? &m->nextn_enorm
                 : which == EI_NEXTN_HNORM ? &m->nextn_hnorm : NULL;
    if (!w) return ei_fail(EI_ERR_INVALID_ARG, "set_nextn: no MTP tensor %d", which);
    const int64_t want0 = which == EI_NEXTN_EH_PROJ ? 2 * d : d, want1 = which == EI_NEXTN_EH_PROJ ? d : 1;
    if (ne0 != want0 || ne1 != want1)
        return ei_fail(EI_ERR_INVALID_ARG, "set_nextn: MTP tensor %d has shape [%lld, %lld], want [%lld, %lld]", which,
                       (long long)ne0, (long long)ne1, (long long)want0, (long long)want1);
    if (which != EI_NEXTN_EH_PROJ && type != EI_TYPE_F32)
        return ei_fail(EI_ERR_UNSUPPORTED, "set_nextn: MTP norm %d must be F32, got type %d", which, type);
    if (ei_row_bytes(type, ne0) <= 0)
        return ei_fail(EI_ERR_UNSUPPORTED, "set_nextn: type %d cannot hold rows of %lld", type, (long long)ne0);
    *w = (ei_weight){.data = data, .type = type, .ne0 = ne0, .ne1 = ne1};
    return EI_OK;
}

ei_status ei_model_share_head(ei_model *m, const ei_runtime *trunk) {
    if (!m || !trunk) return ei_fail(EI_ERR_INVALID_ARG, "share_head: null argument");
    if (m->finalized) return ei_fail(EI_ERR_STATE, "share_head: model already finalized");
    m->head_rt = trunk;
    return EI_OK;
}

ei_status ei_model_finalize(ei_model *m) {
    if (!m) return ei_fail(EI_ERR_INVALID_ARG, "finalize: null model");
    char msg[256];
    const ei_status st = ei_layout_check(&m->cfg, &m->globals, m->layers, msg, sizeof msg);
    if (st != EI_OK) return ei_fail(st, "%s", msg);
    /* the MTP block's input needs all three of its tensors or none */
    const int n_nextn = !!m->nextn_eh_proj.data + !!m->nextn_enorm.data + !!m->nextn_hnorm.data;
    if (n_nextn != 0 && n_nextn != 3)
        return ei_fail(EI_ERR_INVALID_ARG, "finalize: the MTP block has %d of its 3 input tensors (eh_proj, enorm, hnorm)",
                       n_nextn);
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
