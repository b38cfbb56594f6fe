/* Tensor roles: where each weight of a model goes, shared by the CPU runtime
 * (native/src) and the CUDA backend (native/cuda). Global roles take layer = -1.
 *
 * A role's name is EI_T_ plus the upper-cased role of the architecture table
 * (edgeinfer/arch/table.py), which maps each family's tensor names onto these.
 * Lines starting with '#' never reach cffi (native/build_ffi.py), so constants
 * are enums and the helper below is a macro.
 */
#ifndef EDGEINFER_ROLES_H
#define EDGEINFER_ROLES_H

typedef enum {
    EI_T_TOKEN_EMBD = 0,
    EI_T_OUTPUT_NORM = 1,
    EI_T_OUTPUT = 2,          /* optional: absent -> tied to token_embd */
    EI_T_ROPE_FREQS = 3,      /* optional: per-frequency divisors, rope_dim/2 floats (Llama 3.1) */
    EI_T_ATTN_NORM = 10,
    EI_T_ATTN_Q = 11,
    EI_T_ATTN_K = 12,
    EI_T_ATTN_V = 13,
    EI_T_ATTN_Q_BIAS = 14,    /* present iff ei_model_config.has_qkv_bias */
    EI_T_ATTN_K_BIAS = 15,
    EI_T_ATTN_V_BIAS = 16,
    EI_T_ATTN_OUTPUT = 17,
    EI_T_FFN_NORM = 18,
    EI_T_FFN_GATE = 19,
    EI_T_FFN_UP = 20,
    EI_T_FFN_DOWN = 21,
    /* per-head Q/K norms and post-norms (Qwen3, Gemma 3) */
    EI_T_ATTN_Q_NORM = 40,    /* head_dim weights, iff has_qk_norm */
    EI_T_ATTN_K_NORM = 41,
    EI_T_ATTN_POST_NORM = 42, /* n_embd weights, iff has_post_norms */
    EI_T_FFN_POST_NORM = 43
} ei_tensor_role;

/* 1-D roles (norm weights, biases, RoPE factors): one row, kept in f32. */
#define EI_ROLE_IS_VECTOR(r)                                                              \
    ((r) == EI_T_OUTPUT_NORM || (r) == EI_T_ROPE_FREQS || (r) == EI_T_ATTN_NORM ||       \
     (r) == EI_T_FFN_NORM || (r) == EI_T_ATTN_Q_BIAS || (r) == EI_T_ATTN_K_BIAS ||      \
     (r) == EI_T_ATTN_V_BIAS || (r) == EI_T_ATTN_Q_NORM || (r) == EI_T_ATTN_K_NORM ||  \
     (r) == EI_T_ATTN_POST_NORM || (r) == EI_T_FFN_POST_NORM)

#endif
