/* The native model layout of both runtimes, generated from edgeinfer_layout.def: the weight
 * structs, the role -> weight mapping, the checks of a configuration and of a loaded model,
 * and which layers slide. Internal (not part of the C API cffi sees); C11 and C++17 alike,
 * so native/src and native/cuda/forward.cu share every line of it.
 */
#ifndef EDGEINFER_LAYOUT_H
#define EDGEINFER_LAYOUT_H
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "edgeinfer.h"

/* One weight in memory the runtime does not own: the GGUF mmap (CPU) or the device arena (CUDA). */
typedef struct {
    const void *data;   /* NULL when absent */
    int type;
    int64_t ne0, ne1;   /* ne0 = row length, ne1 = rows */
} ei_weight;

#define EI_FIELD_GLOBAL_GLOBAL(field) ei_weight field;
#define EI_FIELD_GLOBAL_LAYER(field)
#define EI_FIELD_LAYER_GLOBAL(field)
#define EI_FIELD_LAYER_LAYER(field) ei_weight field;

/* The weights used once per model (scope GLOBAL). */
typedef struct {
#define EI_ROLE(NAME, id, field, kind, scope, ne0, ne1, presence) EI_FIELD_GLOBAL_##scope(field)
#include "edgeinfer_layout.def"
#undef EI_ROLE
} ei_globals;

/* The weights of one layer (scope LAYER). */
typedef struct {
#define EI_ROLE(NAME, id, field, kind, scope, ne0, ne1, presence) EI_FIELD_LAYER_##scope(field)
#include "edgeinfer_layout.def"
#undef EI_ROLE
} ei_layer;

#define EI_KIND_VECTOR 1
#define EI_KIND_MATRIX 0
#define EI_SCOPE_IS_LAYER_GLOBAL 0
#define EI_SCOPE_IS_LAYER_LAYER 1
#define EI_OFFSET_GLOBAL(field) offsetof(ei_globals, field)
#define EI_OFFSET_LAYER(field) offsetof(ei_layer, field)

/* What the layout knows of a role: its name (EI_T_<name>), its kind and scope,
 * and where its weight sits in ei_globals or ei_layer. NULL for an unknown role. */
typedef struct {
    const char *name;
    int vector, per_layer;
    size_t offset;
} ei_role_desc;

static inline const ei_role_desc *ei_role_find(int role) {
    switch (role) {
#define EI_ROLE(NAME, id, field, kind, scope, ne0, ne1, presence)                                   \
    case id: {                                                                                     \
        static const ei_role_desc d = {#NAME, EI_KIND_##kind, EI_SCOPE_IS_LAYER_##scope, EI_OFFSET_##scope(field)}; \
        return &d;                                                                                 \
    }
#include "edgeinfer_layout.def"
#undef EI_ROLE
    default: return NULL;
    }
}

/* Roles kept in f32 and read element-wise (norm weights, biases, RoPE factors, conv taps). */
static inline int ei_role_is_vector(int role) {
    const ei_role_desc *d = ei_role_find(role);
    return d && d->vector;
}

/* The weight of `role` at `layer` (-1 for global roles); NULL for no such role or layer. */
static inline ei_weight *ei_weight_slot(ei_globals *g, ei_layer *layers, int n_layer, int layer, int role) {
    const ei_role_desc *d = ei_role_find(role);
    if (!d || d->per_layer != (layer >= 0) || layer >= n_layer) return NULL;
    char *owner = d->per_layer ? (char *)&layers[layer] : (char *)g;
    return (ei_weight *)(owner + d->offset);
}

typedef enum { EI_MUST_BE_ABSENT = 0, EI_MAY_BE_ABSENT = 1, EI_REQUIRED = 2 } ei_presence;

/* The kind of layer l (ei_layer_kind); global roles (l < 0) count as attention. */
static inline int ei_layer_kind_of(const ei_model_config *c, int l) {
    return l < 0 ? EI_LAYER_ATTENTION : c->layer_kind[l];
}

/* Layer l keeps a recurrent state per slot rather than KV cells. */
static inline int ei_layer_is_recurrent(const ei_model_config *c, int l) {
    return ei_layer_kind_of(c, l) != EI_LAYER_ATTENTION;
}

/* Qwen3.5's delta-net sizes: the value width (v heads x head size) and the conv's channels (q, k, v). */
/* A slot's run of at least this many tokens goes through the delta rule by chunks of it (prefill),
 * a shorter one token by token; on the CPU and on CUDA alike. */
#define EI_DELTA_CHUNK 64

static inline int64_t ei_deltanet_inner(const ei_model_config *c) { return (int64_t)c->ssm_v_heads * c->ssm_head_dim; }
static inline int64_t ei_deltanet_conv_dim(const ei_model_config *c) {
    return (int64_t)(2 * c->ssm_k_heads + c->ssm_v_heads) * c->ssm_head_dim;
}

/* Channels of layer l's causal conv window (0: no window). */
static inline int64_t ei_layer_conv_channels(const ei_model_config *c, int l) {
    switch (ei_layer_kind_of(c, l)) {
    case EI_LAYER_SHORTCONV: return c->n_embd;
    case EI_LAYER_DELTANET: return ei_deltanet_conv_dim(c);
    default: return 0;
    }
}

/* Floats of layer l's recurrent state per slot: its conv window, the last conv_kernel - 1 inputs
 * of each channel ([conv_kernel - 1][channels], oldest first), then any matrix of its kind. */
static inline int64_t ei_layer_state_floats(const ei_model_config *c, int l) {
    const int64_t window = c->conv_kernel > 1 ? (int64_t)(c->conv_kernel - 1) * ei_layer_conv_channels(c, l) : 0;
    switch (ei_layer_kind_of(c, l)) {
    case EI_LAYER_SHORTCONV: return window;
    case EI_LAYER_DELTANET: return window + ei_deltanet_inner(c) * c->ssm_head_dim;   /* then [v head][d_k][d_v] */
    default: return 0;
    }
}

/* Layer l is a sliding-window (local) layer; global iff (l + 1) % swa_pattern == 0, as llama.cpp
 * and transformers lay out Gemma 3 (5 local : 1 global for a pattern of 6), or layer_full[l] says
 * so (Gemma 4's per-layer layout). */
static inline int ei_layer_is_local(const ei_model_config *c, int l) {
    return c->swa_window > 0 && !(l >= 0 && c->layer_full[l]) && (c->swa_pattern == 0 || (l + 1) % c->swa_pattern != 0);
}

/* Layer l rotates q and k; with a no-RoPE step, every step-th layer does not (SmolLM3, as llama.cpp's
 * n_no_rope_layer_step and transformers' no_rope_layers lay it out). */
/* First position a sliding-window layer keeps of a prefix of n (a copy or a save takes
 * [first, n)): the window a token at n may attend to, and one more. */
static inline int32_t ei_window_first(const ei_model_config *c, int32_t n) {
    return c->swa_window < n ? n - c->swa_window : 0;
}

static inline int ei_layer_uses_rope(const ei_model_config *c, int l) {
    return c->no_rope_layer_step <= 0 || (l + 1) % c->no_rope_layer_step != 0;
}

/* ---- Gemma 4: per-layer head size and FFN width, KV-shared layers ---- */
/* Head size of layer l (-1: the model's, the widest). */
static inline int ei_layer_head_dim(const ei_model_config *c, int l) {
    return l >= 0 && c->head_dim_swa > 0 && ei_layer_is_local(c, l) ? c->head_dim_swa : c->head_dim;
}

/* Dimensions layer l rotates per head. */
static inline int ei_layer_rope_dim(const ei_model_config *c, int l) {
    return l >= 0 && c->rope_dim_swa > 0 && ei_layer_is_local(c, l) ? c->rope_dim_swa : c->rope_dim;
}

/* FFN width of layer l (-1: the widest). */
static inline int ei_layer_n_ff(const ei_model_config *c, int l) {
    return l >= 0 && c->n_ff_per_layer[l] > 0 ? c->n_ff_per_layer[l] : c->n_ff;
}

/* Layer l writes K and V of its own (an attention layer before the KV-shared ones). */
static inline int ei_layer_stores_kv(const ei_model_config *c, int l) {
    return (l < 0 || c->layer_kind[l] == EI_LAYER_ATTENTION) && l < c->n_layer - c->n_kv_shared;
}

/* The layer whose KV layer l attends over: itself, or for a KV-shared layer the last layer that stores KV
 * of its own kind (sliding or not), as transformers' Gemma 4 picks it; -1 when there is none. */
static inline int ei_layer_kv_source(const ei_model_config *c, int l) {
    if (ei_layer_stores_kv(c, l)) return l;
    for (int s = c->n_layer - c->n_kv_shared - 1; s >= 0; s--)
        if (ei_layer_stores_kv(c, s) && ei_layer_is_local(c, s) == ei_layer_is_local(c, l)) return s;
    return -1;
}

#define EI_PRESENCE_ALWAYS EI_REQUIRED
#define EI_PRESENCE_OPTIONAL EI_MAY_BE_ABSENT
#define EI_PRESENCE_IF(flag) (c->flag ? EI_REQUIRED : EI_MUST_BE_ABSENT)
#define EI_PRESENCE_ATTN (ei_layer_kind_of(c, layer) == EI_LAYER_ATTENTION ? EI_REQUIRED : EI_MUST_BE_ABSENT)
#define EI_PRESENCE_ATTN_IF(flag) \
    (ei_layer_kind_of(c, layer) == EI_LAYER_ATTENTION && c->flag ? EI_REQUIRED : EI_MUST_BE_ABSENT)
#define EI_PRESENCE_KV (ei_layer_stores_kv(c, layer) ? EI_REQUIRED : EI_MUST_BE_ABSENT)
#define EI_PRESENCE_KV_IF(flag) (ei_layer_stores_kv(c, layer) && c->flag ? EI_REQUIRED : EI_MUST_BE_ABSENT)
#define EI_PRESENCE_ON(KIND) (ei_layer_kind_of(c, layer) == EI_LAYER_##KIND ? EI_REQUIRED : EI_MUST_BE_ABSENT)

/* Whether a model of config c has `role` at `layer` (-1 for global roles), and its shape there. */
static inline ei_presence ei_role_expect(const ei_model_config *c, int role, int layer, int64_t *ne0_out,
                                         int64_t *ne1_out) {
    const int64_t n_embd = c->n_embd, n_ff = ei_layer_n_ff(c, layer), n_vocab = c->n_vocab;
    const int64_t head_dim = ei_layer_head_dim(c, layer);
    const int64_t q_dim = (int64_t)c->n_head * head_dim, kv_dim = (int64_t)c->n_head_kv * head_dim;
    const int64_t rope_half = c->rope_dim / 2, conv_kernel = c->conv_kernel, n_embd_x3 = 3 * n_embd;
    const int64_t n_ple = c->n_embd_per_layer, n_ple_all = n_ple * c->n_layer;
    (void)n_embd, (void)n_ff, (void)n_vocab, (void)head_dim, (void)q_dim, (void)kv_dim, (void)rope_half;
    (void)conv_kernel, (void)n_embd_x3, (void)layer, (void)n_ple, (void)n_ple_all;
    const int64_t q_rows = c->has_attn_gate ? 2 * q_dim : q_dim, ssm_head_dim = c->ssm_head_dim;
    const int64_t ssm_v_heads = c->ssm_v_heads, ssm_inner = ei_deltanet_inner(c), ssm_conv_dim = ei_deltanet_conv_dim(c);
    (void)q_rows, (void)ssm_head_dim, (void)ssm_v_heads, (void)ssm_inner, (void)ssm_conv_dim;
    switch (role) {
#define EI_ROLE(NAME, id, field, kind, scope, ne0, ne1, presence) \
    case id: *ne0_out = ne0; *ne1_out = ne1; return EI_PRESENCE_##presence;
#include "edgeinfer_layout.def"
#undef EI_ROLE
    default: *ne0_out = *ne1_out = 0; return EI_MUST_BE_ABSENT;
    }
}

enum { EI_MAX_LAYERS = 1024, EI_MAX_DIM = 1 << 20, EI_MAX_HEAD_DIM = 1024 };

#define EI_FAIL_(st, ...) return (snprintf(msg, n, __VA_ARGS__), (st))

/* EI_OK for a configuration both runtimes can hold, else the status and a message in msg[0..n). */
static inline ei_status ei_config_check(const ei_model_config *c, char *msg, size_t n) {
    if (c->n_layer < 1 || c->n_layer > EI_MAX_LAYERS) EI_FAIL_(EI_ERR_INVALID_ARG, "n_layer=%d out of range", c->n_layer);
    if (c->n_embd < 1 || c->n_embd > EI_MAX_DIM || c->n_ff < 1 || c->n_ff > EI_MAX_DIM || c->n_vocab < 1 ||
        c->n_vocab > 16 * EI_MAX_DIM)
        EI_FAIL_(EI_ERR_INVALID_ARG, "bad dimensions n_embd=%d n_ff=%d n_vocab=%d", c->n_embd, c->n_ff, c->n_vocab);
    if (c->n_head < 1 || c->n_head_kv < 1 || c->n_head % c->n_head_kv != 0)
        EI_FAIL_(EI_ERR_INVALID_ARG, "n_head=%d must be a positive multiple of n_head_kv=%d", c->n_head, c->n_head_kv);
    if (c->head_dim < 2 || c->head_dim % 2 || c->head_dim > EI_MAX_HEAD_DIM)
        EI_FAIL_(EI_ERR_INVALID_ARG, "head_dim=%d must be even and <= %d", c->head_dim, EI_MAX_HEAD_DIM);
    if (c->rope_dim < 0 || c->rope_dim > c->head_dim || c->rope_dim % 2)
        EI_FAIL_(EI_ERR_INVALID_ARG, "rope_dim=%d must be even and <= head_dim", c->rope_dim);
    const int32_t flags[] = {c->rope_neox, c->has_qkv_bias, c->has_qk_norm, c->has_post_norms, c->act_gelu};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (flags[i] != 0 && flags[i] != 1)
            EI_FAIL_(EI_ERR_INVALID_ARG, "rope_neox=%d, has_qkv_bias=%d, has_qk_norm=%d, has_post_norms=%d and "
                                         "act_gelu=%d must be 0 or 1", c->rope_neox, c->has_qkv_bias, c->has_qk_norm,
                     c->has_post_norms, c->act_gelu);
    if (!(c->rms_eps > 0) || !(c->rope_theta > 0) || !(c->rope_freq_scale > 0) || !isfinite(c->rms_eps) ||
        !isfinite(c->rope_theta) || !isfinite(c->rope_freq_scale))
        EI_FAIL_(EI_ERR_INVALID_ARG, "rms_eps, rope_theta and rope_freq_scale must be finite and positive");
    if (!(c->embd_scale >= 0) || !(c->attn_scale >= 0) || !(c->final_softcap >= 0) || !(c->rope_theta_local >= 0) ||
        c->swa_window < 0 || c->swa_pattern < 0 || !isfinite(c->embd_scale) || !isfinite(c->attn_scale) ||
        !isfinite(c->final_softcap) || !isfinite(c->rope_theta_local))
        EI_FAIL_(EI_ERR_INVALID_ARG, "embd_scale, attn_scale, final_softcap, rope_theta_local, swa_window "
                                     "and swa_pattern must be finite and >= 0");
    if (c->no_rope_layer_step < 0)
        EI_FAIL_(EI_ERR_INVALID_ARG, "no_rope_layer_step=%d must be >= 0", c->no_rope_layer_step);
    if (!(c->rope_attn_factor >= 0) || c->rope_attn_factor > 1e3f)
        EI_FAIL_(EI_ERR_INVALID_ARG, "rope_attn_factor=%g must be in [0, 1000]", (double)c->rope_attn_factor);
    int recurrent = 0;
    for (int l = 0; l < c->n_layer; l++) {
        if (c->layer_kind[l] >= EI_LAYER_KIND_COUNT)
            EI_FAIL_(EI_ERR_INVALID_ARG, "layer_kind[%d]=%d is not an ei_layer_kind", l, c->layer_kind[l]);
        recurrent |= c->layer_kind[l] != EI_LAYER_ATTENTION;
    }
    for (int l = c->n_layer; l < (int)sizeof c->layer_kind; l++)
        if (c->layer_kind[l]) EI_FAIL_(EI_ERR_INVALID_ARG, "layer_kind[%d] set beyond n_layer=%d", l, c->n_layer);
    /* Gemma 4: the second head size, per-layer widths and sliding flags, KV-shared layers, per-layer inputs */
    if (c->head_dim_swa < 0 || c->head_dim_swa % 2 || c->head_dim_swa > c->head_dim)
        EI_FAIL_(EI_ERR_INVALID_ARG, "head_dim_swa=%d must be even and in [0, head_dim=%d]", c->head_dim_swa, c->head_dim);
    if (c->rope_dim_swa < 0 || c->rope_dim_swa % 2 || c->rope_dim_swa > (c->head_dim_swa ? c->head_dim_swa : c->head_dim))
        EI_FAIL_(EI_ERR_INVALID_ARG, "rope_dim_swa=%d must be even and <= the sliding layers' head size", c->rope_dim_swa);
    if (c->has_v_norm != 0 && c->has_v_norm != 1) EI_FAIL_(EI_ERR_INVALID_ARG, "has_v_norm=%d must be 0 or 1", c->has_v_norm);
    if (c->n_embd_per_layer < 0 || c->n_embd_per_layer > EI_MAX_DIM / c->n_layer)
        EI_FAIL_(EI_ERR_INVALID_ARG, "n_embd_per_layer=%d out of range", c->n_embd_per_layer);
    if (c->n_kv_shared < 0 || c->n_kv_shared >= c->n_layer)
        EI_FAIL_(EI_ERR_INVALID_ARG, "n_kv_shared=%d must be in [0, n_layer=%d)", c->n_kv_shared, c->n_layer);
    for (int l = 0; l < (int)(sizeof c->layer_full); l++) {
        if (l >= c->n_layer ? c->layer_full[l] || c->n_ff_per_layer[l] : c->layer_full[l] > 1)
            EI_FAIL_(EI_ERR_INVALID_ARG, "layer_full[%d]=%d / n_ff_per_layer[%d]=%d: 0 or 1 below n_layer=%d, else 0", l,
                     c->layer_full[l], l, c->n_ff_per_layer[l], c->n_layer);
        if (l < c->n_layer && (c->n_ff_per_layer[l] < 0 || c->n_ff_per_layer[l] > c->n_ff))
            EI_FAIL_(EI_ERR_INVALID_ARG, "n_ff_per_layer[%d]=%d must be in [0, n_ff=%d]", l, c->n_ff_per_layer[l], c->n_ff);
        if (l < c->n_layer && !ei_layer_is_recurrent(c, l) && ei_layer_kv_source(c, l) < 0)
            EI_FAIL_(EI_ERR_INVALID_ARG, "KV-shared layer %d has no earlier layer of its kind that stores KV", l);
    }
    int deltanet = 0;
    for (int l = 0; l < c->n_layer; l++) deltanet |= c->layer_kind[l] == EI_LAYER_DELTANET;
    if (deltanet ? c->ssm_head_dim < 1 || c->ssm_head_dim > EI_MAX_HEAD_DIM || c->ssm_k_heads < 1 ||
                       c->ssm_v_heads < c->ssm_k_heads || c->ssm_v_heads % c->ssm_k_heads || c->ssm_v_heads > 1024
                 : c->ssm_head_dim || c->ssm_k_heads || c->ssm_v_heads)
        EI_FAIL_(EI_ERR_INVALID_ARG, "ssm_head_dim=%d, ssm_k_heads=%d, ssm_v_heads=%d: delta-net layers need a head size "
                                     "and v heads a multiple of k heads, other models all 0", c->ssm_head_dim,
                 c->ssm_k_heads, c->ssm_v_heads);
    if (c->has_attn_gate != 0 && c->has_attn_gate != 1)
        EI_FAIL_(EI_ERR_INVALID_ARG, "has_attn_gate=%d must be 0 or 1", c->has_attn_gate);
    if (recurrent ? c->conv_kernel < 2 || c->conv_kernel > 16 : c->conv_kernel != 0)
        EI_FAIL_(EI_ERR_INVALID_ARG, "conv_kernel=%d must be in [2, 16] with recurrent layers, else 0", c->conv_kernel);
    return EI_OK;
}

/* One weight against what config c expects of `role` at `layer`; messages name the role as the
 * architecture table does (lower case). */
static inline ei_status ei_weight_check(const ei_model_config *c, const ei_weight *w, int role, int layer, char *msg,
                                        size_t n) {
    const ei_role_desc *d = ei_role_find(role);
    char name[64];
    size_t k = 0;
    for (; d->name[k] && k + 1 < sizeof name; k++) name[k] = (char)(d->name[k] | (d->name[k] >= 'A' && d->name[k] <= 'Z' ? 0x20 : 0));
    name[k] = 0;
    int64_t ne0, ne1;
    const ei_presence need = ei_role_expect(c, role, layer, &ne0, &ne1);
    if (!w->data) {
        if (need == EI_REQUIRED) EI_FAIL_(EI_ERR_INVALID_ARG, "missing tensor %s (layer %d)", name, layer);
        return EI_OK;
    }
    if (need == EI_MUST_BE_ABSENT)
        EI_FAIL_(EI_ERR_INVALID_ARG, "tensor %s (layer %d) for a model configured without it", name, layer);
    if (w->ne0 != ne0 || w->ne1 != ne1)
        EI_FAIL_(EI_ERR_INVALID_ARG, "tensor %s (layer %d) has shape [%lld, %lld], expected [%lld, %lld]", name,
                 layer, (long long)w->ne0, (long long)w->ne1, (long long)ne0, (long long)ne1);
    if (d->vector && w->type != EI_TYPE_F32)
        EI_FAIL_(EI_ERR_UNSUPPORTED, "tensor %s (layer %d) must be F32 (norms, biases, conv taps), got type %d", name,
                 layer, w->type);
    return EI_OK;
}

/* Every weight of a model against its config: each required one there, none that the config
 * rules out, every shape as the layout says. */
static inline ei_status ei_layout_check(const ei_model_config *c, const ei_globals *g, const ei_layer *layers,
                                        char *msg, size_t n) {
    static const int roles[] = {
#define EI_ROLE(NAME, id, field, kind, scope, ne0, ne1, presence) id,
#include "edgeinfer_layout.def"
#undef EI_ROLE
    };
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        const ei_role_desc *d = ei_role_find(roles[i]);
        for (int l = d->per_layer ? 0 : -1; l < (d->per_layer ? c->n_layer : 0); l++) {
            const ei_weight *w = ei_weight_slot((ei_globals *)g, (ei_layer *)layers, c->n_layer, l, roles[i]);
            const ei_status st = ei_weight_check(c, w, roles[i], l, msg, n);
            if (st != EI_OK) return st;
        }
    }
    return EI_OK;
}
#undef EI_FAIL_

#endif
