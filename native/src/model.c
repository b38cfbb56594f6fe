#include "model.h"

#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "kernels.h"

enum { MAX_LAYERS = 1024, MAX_DIM = 1 << 20 };

ei_status ei_model_create(const ei_model_config *cfg, ei_model **out) {
    if (!cfg || !out) return ei_fail(EI_ERR_INVALID_ARG, "model_create: null argument");
    *out = NULL;
    if (cfg->n_layer < 1 || cfg->n_layer > MAX_LAYERS)
        return ei_fail(EI_ERR_INVALID_ARG, "n_layer=%d out of range", cfg->n_layer);
    if (cfg->n_embd < 1 || cfg->n_embd > MAX_DIM || cfg->n_ff < 1 || cfg->n_ff > MAX_DIM ||
        cfg->n_vocab < 1 || cfg->n_vocab > 16 * MAX_DIM)
        return ei_fail(EI_ERR_INVALID_ARG, "bad dimensions n_embd=%d n_ff=%d n_vocab=%d",
                       cfg->n_embd, cfg->n_ff, cfg->n_vocab);
    if (cfg->n_head < 1 || cfg->n_head_kv < 1 || cfg->n_head % cfg->n_head_kv != 0)
        return ei_fail(EI_ERR_INVALID_ARG, "n_head=%d must be a positive multiple of n_head_kv=%d",
                       cfg->n_head, cfg->n_head_kv);
    if (cfg->head_dim < 2 || cfg->head_dim % 2 || cfg->head_dim > 1024)
        return ei_fail(EI_ERR_INVALID_ARG, "head_dim=%d must be even and <= 1024", cfg->head_dim);
    if ((cfg->rope_neox != 0 && cfg->rope_neox != 1) || (cfg->has_qkv_bias != 0 && cfg->has_qkv_bias != 1))
        return ei_fail(EI_ERR_INVALID_ARG, "rope_neox=%d and has_qkv_bias=%d must be 0 or 1", cfg->rope_neox,
                       cfg->has_qkv_bias);
    if (cfg->rope_dim < 0 || cfg->rope_dim > cfg->head_dim || cfg->rope_dim % 2)
        return ei_fail(EI_ERR_INVALID_ARG, "rope_dim=%d must be even and <= head_dim", cfg->rope_dim);
    if (!(cfg->rms_eps > 0) || !(cfg->rope_theta > 0) || !(cfg->rope_freq_scale > 0))
        return ei_fail(EI_ERR_INVALID_ARG, "rms_eps, rope_theta and rope_freq_scale must be positive");
    if ((cfg->has_qk_norm != 0 && cfg->has_qk_norm != 1) || (cfg->has_post_norms != 0 && cfg->has_post_norms != 1) ||
        (cfg->act_gelu != 0 && cfg->act_gelu != 1))
        return ei_fail(EI_ERR_INVALID_ARG, "has_qk_norm=%d, has_post_norms=%d and act_gelu=%d must be 0 or 1",
                       cfg->has_qk_norm, cfg->has_post_norms, cfg->act_gelu);
    if (!(cfg->embd_scale >= 0) || !(cfg->attn_scale >= 0) || !(cfg->final_softcap >= 0) ||
        !(cfg->rope_theta_local >= 0) || cfg->swa_window < 0 || cfg->swa_pattern < 0 ||
        !isfinite(cfg->embd_scale) || !isfinite(cfg->attn_scale) || !isfinite(cfg->final_softcap) ||
        !isfinite(cfg->rope_theta_local))
        return ei_fail(EI_ERR_INVALID_ARG, "embd_scale, attn_scale, final_softcap, rope_theta_local, swa_window "
                                           "and swa_pattern must be finite and >= 0");
    if (!(cfg->rope_attn_factor >= 0) || cfg->rope_attn_factor > 1e3f)
        return ei_fail(EI_ERR_INVALID_ARG, "rope_attn_factor=%g must be in [0, 1000]", (double)cfg->rope_attn_factor);
    ei_model *m = calloc(1, sizeof *m);
    if (!m) return ei_fail(EI_ERR_OUT_OF_MEMORY, "model_create: out of memory");
    m->layers = calloc((size_t)cfg->n_layer, sizeof(ei_layer));
    if (!m->layers) { free(m); return ei_fail(EI_ERR_OUT_OF_MEMORY, "model_create: out of memory"); }
    m->cfg = *cfg;
    *out = m;
    return EI_OK;
}

static ei_weight *slot_for(ei_model *m, int layer, int role) {
    if (layer < 0) {
        switch (role) {
        case EI_T_TOKEN_EMBD: return &m->tok_embd;
        case EI_T_OUTPUT_NORM: return &m->output_norm;
        case EI_T_OUTPUT: return &m->output;
        case EI_T_ROPE_FREQS: return &m->rope_freqs;
        default: return NULL;
        }
    }
    if (layer >= m->cfg.n_layer) return NULL;
    ei_layer *L = &m->layers[layer];
    switch (role) {
    case EI_T_ATTN_NORM: return &L->attn_norm;
    case EI_T_ATTN_Q: return &L->wq;
    case EI_T_ATTN_K: return &L->wk;
    case EI_T_ATTN_V: return &L->wv;
    case EI_T_ATTN_Q_BIAS: return &L->bq;
    case EI_T_ATTN_K_BIAS: return &L->bk;
    case EI_T_ATTN_V_BIAS: return &L->bv;
    case EI_T_ATTN_OUTPUT: return &L->wo;
    case EI_T_FFN_NORM: return &L->ffn_norm;
    case EI_T_FFN_GATE: return &L->w_gate;
    case EI_T_FFN_UP: return &L->w_up;
    case EI_T_FFN_DOWN: return &L->w_down;
    case EI_T_ATTN_Q_NORM: return &L->q_norm;
    case EI_T_ATTN_K_NORM: return &L->k_norm;
    case EI_T_ATTN_POST_NORM: return &L->attn_post_norm;
    case EI_T_FFN_POST_NORM: return &L->ffn_post_norm;
    default: return NULL;
    }
}

ei_status ei_model_set_tensor(ei_model *m, int layer, int role, const void *data, int type,
                              int64_t ne0, int64_t ne1) {
    if (!m || !data) return ei_fail(EI_ERR_INVALID_ARG, "set_tensor: null argument");
    if (m->finalized) return ei_fail(EI_ERR_STATE, "set_tensor: model already finalized");
    ei_weight *w = slot_for(m, layer, role);
    if (!w) return ei_fail(EI_ERR_INVALID_ARG, "set_tensor: no tensor role %d for layer %d", role, layer);
    if (!m->cfg.has_qkv_bias && (role == EI_T_ATTN_Q_BIAS || role == EI_T_ATTN_K_BIAS || role == EI_T_ATTN_V_BIAS))
        return ei_fail(EI_ERR_INVALID_ARG, "set_tensor: q/k/v bias (role %d) for a model configured without them",
                       role);
    if ((!m->cfg.has_qk_norm && (role == EI_T_ATTN_Q_NORM || role == EI_T_ATTN_K_NORM)) ||
        (!m->cfg.has_post_norms && (role == EI_T_ATTN_POST_NORM || role == EI_T_FFN_POST_NORM)))
        return ei_fail(EI_ERR_INVALID_ARG, "set_tensor: norm role %d for a model configured without it", role);
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

static ei_status expect(const ei_weight *w, const char *name, int layer, int64_t ne0, int64_t ne1,
                        int required, int float_only) {
    if (!w->data) {
        if (!required) return EI_OK;
        return ei_fail(EI_ERR_INVALID_ARG, "missing tensor %s (layer %d)", name, layer);
    }
    if (w->ne0 != ne0 || w->ne1 != ne1)
        return ei_fail(EI_ERR_INVALID_ARG, "tensor %s (layer %d) has shape [%lld, %lld], expected [%lld, %lld]",
                       name, layer, (long long)w->ne0, (long long)w->ne1, (long long)ne0, (long long)ne1);
    if (float_only && w->type != EI_TYPE_F32)
        return ei_fail(EI_ERR_UNSUPPORTED, "tensor %s (layer %d) must be F32 (norms and biases), got type %d",
                       name, layer, w->type);
    return EI_OK;
}

ei_status ei_model_finalize(ei_model *m) {
    if (!m) return ei_fail(EI_ERR_INVALID_ARG, "finalize: null model");
    const ei_model_config *c = &m->cfg;
    int64_t d = c->n_embd, q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_head_kv * c->head_dim;
    ei_status st;
#define CHECK(w, name, layer, a, b, req, fl) \
    if ((st = expect(w, name, layer, a, b, req, fl)) != EI_OK) return st
    CHECK(&m->tok_embd, "token_embd", -1, d, c->n_vocab, 1, 0);
    CHECK(&m->output_norm, "output_norm", -1, d, 1, 1, 1);
    CHECK(&m->output, "output", -1, d, c->n_vocab, 0, 0);
    CHECK(&m->rope_freqs, "rope_freqs", -1, c->rope_dim / 2, 1, 0, 1);
    for (int l = 0; l < c->n_layer; l++) {
        ei_layer *L = &m->layers[l];
        CHECK(&L->attn_norm, "attn_norm", l, d, 1, 1, 1);
        CHECK(&L->wq, "attn_q", l, d, q, 1, 0);
        CHECK(&L->wk, "attn_k", l, d, kv, 1, 0);
        CHECK(&L->wv, "attn_v", l, d, kv, 1, 0);
        CHECK(&L->bq, "attn_q.bias", l, q, 1, c->has_qkv_bias, 1);
        CHECK(&L->bk, "attn_k.bias", l, kv, 1, c->has_qkv_bias, 1);
        CHECK(&L->bv, "attn_v.bias", l, kv, 1, c->has_qkv_bias, 1);
        CHECK(&L->wo, "attn_output", l, q, d, 1, 0);
        CHECK(&L->ffn_norm, "ffn_norm", l, d, 1, 1, 1);
        CHECK(&L->w_gate, "ffn_gate", l, d, c->n_ff, 1, 0);
        CHECK(&L->w_up, "ffn_up", l, d, c->n_ff, 1, 0);
        CHECK(&L->w_down, "ffn_down", l, c->n_ff, d, 1, 0);
        CHECK(&L->q_norm, "attn_q_norm", l, c->head_dim, 1, c->has_qk_norm, 1);
        CHECK(&L->k_norm, "attn_k_norm", l, c->head_dim, 1, c->has_qk_norm, 1);
        CHECK(&L->attn_post_norm, "post_attention_norm", l, d, 1, c->has_post_norms, 1);
        CHECK(&L->ffn_post_norm, "post_ffw_norm", l, d, 1, c->has_post_norms, 1);
    }
#undef CHECK
    m->finalized = 1;
    return EI_OK;
}

void ei_model_free(ei_model *m) {
    if (!m) return;
    free(m->layers);
    free(m);
}

const ei_weight *ei_model_output(const ei_model *m) {
    return m->output.data ? &m->output : &m->tok_embd;
}
