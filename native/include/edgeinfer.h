/* edgeinfer C API.
 *
 * The one door into native code. cffi compiles edgeinfer/_native against this
 * header (API mode), so every signature below is checked by the C compiler.
 * Lines starting with '#' are stripped before cffi parses the declarations, so
 * constants are enums, not macros; the included edgeinfer_roles.h (tensor roles)
 * reaches cffi the same way (native/build_ffi.py reads it first).
 *
 * Rules: no function exits or aborts on bad input; each returns an ei_status
 * and ei_last_error() gives a message for the calling thread.
 */
#ifndef EDGEINFER_H
#define EDGEINFER_H
#include <stddef.h>
#include <stdint.h>
#include "edgeinfer_roles.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    EI_OK = 0,
    EI_ERR_INVALID_ARG = 1,
    EI_ERR_OUT_OF_MEMORY = 2,
    EI_ERR_UNSUPPORTED = 3,
    EI_ERR_RANGE = 4,
    EI_ERR_STATE = 5
} ei_status;

/* Tensor types: the numeric ids are GGML's, as stored in GGUF files. */
typedef enum {
    EI_TYPE_F32 = 0,
    EI_TYPE_F16 = 1,
    EI_TYPE_Q4_0 = 2,
    EI_TYPE_Q4_1 = 3,
    EI_TYPE_Q5_0 = 6,
    EI_TYPE_Q5_1 = 7,
    EI_TYPE_Q8_0 = 8,
    EI_TYPE_Q2_K = 10,
    EI_TYPE_Q3_K = 11,
    EI_TYPE_Q4_K = 12,
    EI_TYPE_Q5_K = 13,
    EI_TYPE_Q6_K = 14,
    EI_TYPE_IQ4_NL = 20,
    EI_TYPE_IQ4_XS = 23,
    EI_TYPE_BF16 = 30
} ei_type;

/* Instruction-set levels for kernels. EI_ISA_BEST picks the best the CPU has. */
typedef enum {
    EI_ISA_BEST = -1,
    EI_ISA_SCALAR = 0,
    EI_ISA_AVX2 = 1,
    EI_ISA_AVX512 = 2,
    EI_ISA_NEON = 3
} ei_isa;

const char *ei_last_error(void);
const char *ei_version(void);

/* ---- CPU features and kernels (exposed for tests and tools) ---- */
int ei_cpu_best_isa(void);                 /* what cpuid allows on this machine */
int ei_isa_supported(int isa);             /* 1 if kernels of that level can run here */
const char *ei_isa_name(int isa);
int ei_physical_cores(void);

/* Block geometry of a type: elements per block and bytes per block. */
ei_status ei_type_block(int type, int32_t *block_elems, int32_t *block_bytes);

/* dst[0..n) = dequantized src; n must be a multiple of the block size. */
ei_status ei_kernel_dequantize(int type, int isa, const void *src, float *dst, int64_t n);

/* *out = dot(row of type `type` with n elements, x[0..n)). For quantized
 * types x is first quantized to the 8-bit activation format (as in a forward
 * pass); float types use x as is. */
ei_status ei_kernel_dot(int type, int isa, int64_t n, const void *row, const float *x, float *out);

/* y[t*n_rows + r] = dot(W row r, x[t*n_cols ..]) for t < n_tok, r < n_rows, using
 * n_threads threads. W rows are contiguous, each of n_cols elements. */
ei_status ei_kernel_matmul(int type, int isa, const void *w, int64_t n_rows, int64_t n_cols,
                           const float *x, int64_t n_tok, float *y, int n_threads);

/* out[j * hd ..] for query heads j < g: softmax(q_j . K / sqrt(hd)) V over the
 * n_cells rows of K and V (kv_type EI_TYPE_F16 or EI_TYPE_Q8_0) whose cell_pos is
 * in [0, pos], computed exactly as the forward pass does (fixed chunks of cells,
 * partials merged in order). */
ei_status ei_kernel_attention(int isa, const float *q, int g, const void *k, const void *v, int kv_type,
                              const int32_t *cell_pos, int32_t n_cells, int32_t pos, int hd, float *out);
/* The same for two tokens' queries over one KV (positions pos0 and pos1), in one pass where
 * the level has a two-token kernel, as a prefill pairs its tokens: each out is the same bits as
 * ei_kernel_attention's. */
ei_status ei_kernel_attention_pair(int isa, const float *q0, const float *q1, int g, const void *k, const void *v,
                                   int kv_type, const int32_t *cell_pos, int32_t n_cells, int32_t pos0, int32_t pos1,
                                   int hd, float *out0, float *out1);

/* gate[i] = silu(gate[i]) * up[i] for i < n: the SwiGLU of the feed-forward block. */
ei_status ei_kernel_swiglu(int isa, float *gate, const float *up, int64_t n);

/* gate[i] = gelu_tanh(gate[i]) * up[i] for i < n: the GeGLU of Gemma's feed-forward block. */
ei_status ei_kernel_geglu(int isa, float *gate, const float *up, int64_t n);
/* y[i] += sum_k c[k] * bt[k * ld + i] for i < n (a LoRA update: B transposed times rank coefficients). */
ei_status ei_kernel_lora_up(int isa, int64_t n, int rank, const float *c, const float *bt, int64_t ld, float *y);

/* Causal depthwise conv1d with state over n_tok tokens of ch channels, taps w[k][c] (tap-major):
 * y[t][c] = sum_{k < K} w[k][c] * in(t - (K - 1) + k)[c], where in(s) is x[s] for s >= 0 and
 * state[K - 1 + s] (the K - 1 inputs before the first token, oldest first, [K - 1][ch]) for
 * s < 0; afterwards state holds the last K - 1 inputs. K in [2, 16]. */
ei_status ei_kernel_conv1d(int isa, const float *w, int K, int64_t ch, float *state, const float *x,
                           int64_t n_tok, float *y);

/* Qwen3.5's gated delta rule over n_tok tokens and n_heads value heads (value head h reads key
 * head h % n_k_heads): q, k [n_tok][n_k_heads][dk] (q already scaled), v [n_tok][n_heads][dv],
 * g (log decays, <= 0) and beta [n_tok][n_heads], state [n_heads][dk][dv], o [n_tok][n_heads][dv]:
 *   S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q.
 * chunk 0: token by token (decode); chunk > 0: by chunks of that many tokens (prefill). */
ei_status ei_kernel_delta_rule(int isa, int chunk, const float *q, const float *k, const float *v, const float *g,
                               const float *beta, int64_t n_tok, int n_heads, int n_k_heads, int dk, int dv,
                               float *state, float *o);

/* x[r] *= scale / sqrt(sum x[r]^2 + eps) for n_rows rows of d floats (delta-net q and k). */
ei_status ei_kernel_l2norm(int isa, float *x, int64_t n_rows, int64_t d, float eps, float scale);

/* x[r] = x[r] / sqrt(mean x[r]^2 + eps) * w * silu(gate[r]) for n_rows rows of d floats. */
ei_status ei_kernel_gated_rms_norm(int isa, float *x, const float *w, const float *gate, int64_t n_rows, int64_t d,
                                   float eps);

/* ---- Model: weights live in memory the caller owns (the GGUF mmap) ---- */
/* Which families exist is Python's business (edgeinfer/arch/table.py); C sees only the
 * hyperparameters and the features the forward pass switches on. */
typedef struct {
    int32_t n_layer;
    int32_t n_embd;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;
    int32_t n_ff;
    int32_t n_vocab;
    int32_t rope_dim;      /* dimensions rotated per head (<= head_dim) */
    int32_t rope_neox;     /* 0: pairs (2i, 2i+1) as llama; 1: pairs (i, i+d/2) as qwen2 */
    int32_t has_qkv_bias;  /* 1: every layer has attn_q/k/v biases; 0: none has */
    float rope_theta;
    float rope_freq_scale; /* linear RoPE scaling: positions are multiplied by it (1 = none) */
    float rms_eps;
    /* ---- per-head Q/K norms, post-norms, GELU, sliding window, softcap (Qwen3, Gemma 3) ---- */
    int32_t has_qk_norm;     /* 1: attn_q_norm / attn_k_norm (head_dim weights) RMSNorm each q and k head before RoPE */
    int32_t has_post_norms;  /* 1: attn_post_norm / ffn_post_norm RMSNorm each block's output before the residual add */
    int32_t act_gelu;        /* 0: SwiGLU (silu(gate) * up); 1: GeGLU with the tanh GELU (gelu(gate) * up) */
    float embd_scale;        /* token embeddings are multiplied by it (0 or 1: none; Gemma: sqrt(n_embd)) */
    float attn_scale;        /* scores = q.k * attn_scale (0: 1/sqrt(head_dim)) */
    float final_softcap;     /* logits = c * tanh(logits / c) (0: none) */
    int32_t swa_window;      /* > 0: local layers attend to the last swa_window positions only */
    int32_t swa_pattern;     /* with swa_window: layer l is global iff (l + 1) % swa_pattern == 0 (0: all local) */
    float rope_theta_local;  /* RoPE base of the local layers (0: rope_theta) */
    /* RoPE (fam-b): cos and sin are multiplied by it, so the rotated dimensions of q and k
     * are scaled (LongRoPE's attention factor; llama.cpp's rope.scaling.attn_factor).
     * 0 or 1: none. */
    float rope_attn_factor;
    /* > 0: layer l skips RoPE iff (l + 1) % no_rope_layer_step == 0 (SmolLM3: 4); 0: every layer rotates */
    int32_t no_rope_layer_step;
    /* ---- hybrid models (LFM2, Qwen3.5): recurrent layers beside attention ---- */
    int32_t conv_kernel;      /* taps of the recurrent layers' causal depthwise conv (LFM2's L_cache); 0: none */
    uint8_t layer_kind[1024]; /* ei_layer_kind of layer l < n_layer (all 0: attention only) */
    /* ---- Qwen3.5: Gated DeltaNet layers (EI_LAYER_DELTANET) and gated attention ---- */
    int32_t ssm_head_dim;     /* d_k = d_v of a delta-net head (0: no delta-net layers) */
    int32_t ssm_k_heads;      /* its q / k heads; value head h reads key head h % ssm_k_heads */
    int32_t ssm_v_heads;      /* its value heads, each with a ssm_head_dim x ssm_head_dim state per slot */
    int32_t has_attn_gate;    /* 1: attn_q rows are each head's query then its output gate (sigmoid) */
    /* ---- Gemma 4: two head sizes, per-layer FFN widths and sliding flags, KV-shared layers, per-layer inputs ---- */
    int32_t head_dim_swa;     /* head size of the sliding-window layers (0: head_dim) */
    int32_t rope_dim_swa;     /* dimensions rotated per head in the sliding-window layers (0: rope_dim) */
    int32_t n_kv_shared;      /* the last n_kv_shared layers store no KV: each attends over the KV of the
                                 last layer before them of its own kind (sliding or not) */
    int32_t n_embd_per_layer; /* > 0: per-layer inputs of this width (per_layer_* roles), added after each FFN */
    int32_t has_v_norm;       /* 1: each v head is RMS-normed (no weight) before it is stored */
    uint8_t layer_full[1024]; /* 1: layer l < n_layer attends to the whole context though swa_window > 0 */
    int32_t n_ff_per_layer[1024]; /* FFN width of layer l < n_layer (0: n_ff, which is the widest) */
} ei_model_config;

/* What a layer's mixing block is. Attention layers hold KV cells in the ring; the others hold a
 * fixed-size recurrent state per slot (their conv window; a delta-rule layer also its matrix). */
typedef enum {
    EI_LAYER_ATTENTION = 0,
    EI_LAYER_SHORTCONV = 1,   /* LFM2: in_proj -> B, C, x; C * conv(B * x); out_proj */
    EI_LAYER_DELTANET = 2,    /* Qwen3.5's Gated DeltaNet */
    EI_LAYER_KIND_COUNT = 3
} ei_layer_kind;

typedef struct ei_model ei_model;

ei_status ei_model_create(const ei_model_config *cfg, ei_model **out);
/* ne0 = elements per row (input dim), ne1 = rows (output dim); 1-D tensors ne1 = 1. */
ei_status ei_model_set_tensor(ei_model *m, int layer, int role, const void *data, int type,
                              int64_t ne0, int64_t ne1);
ei_status ei_model_finalize(ei_model *m);   /* checks every required tensor and shape */
void ei_model_free(ei_model *m);

/* ---- Runtime: thread pool, scratch and the fixed KV ring, allocated once ---- */
typedef struct {
    int32_t n_threads;     /* <= 0: physical cores */
    int32_t n_slots;       /* sequences held at once */
    int32_t n_ctx;         /* KV cells per slot (ring capacity) */
    int32_t n_sink;        /* cells [0, n_sink) are never overwritten */
    int32_t max_batch;     /* most tokens one forward call may carry */
    int32_t kv_type;       /* EI_TYPE_F16, or EI_TYPE_Q8_0 (half the bytes; head_dim % 32 == 0) */
    int32_t isa;           /* EI_ISA_BEST, or a forced level for tests */
    int32_t drop_packed_source; /* 1: weights are a read-only file mapping; once a tensor is
                                   packed, its pages are dropped (madvise) to keep RSS low */
    int32_t slide_window;  /* > 0: a token at pos sees the sink positions [0, n_sink) and the
                              positions (pos - slide_window, pos] only; the ring's cells beyond
                              n_sink + slide_window are slack that a batch may write ahead into
                              (speculative verify on a ring that slides). 0: every cell <= pos */
    int32_t n_snapshots;   /* recurrent models: copies of a slot's recurrent state kept at once
                              (keep_rows of ei_forward); when full, the one after the fewest
                              positions goes first. Ignored without recurrent layers. */
} ei_runtime_params;

typedef struct ei_runtime ei_runtime;

ei_status ei_runtime_create(const ei_model *m, const ei_runtime_params *p, ei_runtime **out);
void ei_runtime_free(ei_runtime *rt);
size_t ei_runtime_kv_bytes(const ei_runtime *rt);
/* Bytes of the recurrent layers' states: each slot's live state and its n_snapshots copies. */
size_t ei_runtime_state_bytes(const ei_runtime *rt);
size_t ei_runtime_scratch_bytes(const ei_runtime *rt);
/* Bytes of the row-interleaved weight copies made for this CPU's kernels. */
size_t ei_runtime_packed_bytes(const ei_runtime *rt);

/* Seconds spent per stage of the forward pass since creation (or the last reset):
 * out[i] for i < min(n, EI_PROF_COUNT), in the order of ei_prof_stage. RECURRENT is a
 * recurrent layer's whole mixer (projections, convolution, delta rule, gated norm). */
typedef enum {
    EI_PROF_EMBED = 0, EI_PROF_NORM, EI_PROF_QKV, EI_PROF_ROPE_KV, EI_PROF_ATTENTION, EI_PROF_ATTN_OUT,
    EI_PROF_FFN_UP, EI_PROF_FFN_ACT, EI_PROF_FFN_DOWN, EI_PROF_HEAD, EI_PROF_RECURRENT, EI_PROF_COUNT
} ei_prof_stage;
int ei_runtime_profile(ei_runtime *rt, double *out, int n, int reset);
/* Empties a slot's cells; its recurrent state starts from zero, its kept copies are dropped. */
ei_status ei_runtime_clear_slot(ei_runtime *rt, int slot);
/* Forgets a slot's cells holding positions >= pos (for prefix reuse) and the recurrent states it
 * kept after more than pos positions. A live recurrent state past pos cannot be rewound: the
 * slot takes no token until ei_runtime_restore_state (pos 0: it starts from zero). */
ei_status ei_runtime_forget_from(ei_runtime *rt, int slot, int32_t pos);
/* Makes slot dst hold what slot src holds at positions [0, n) and nothing else (a shared
 * prompt, copied rather than computed again). src must not have wrapped past position n:
 * those positions sit in cells [0, n). src == dst keeps [0, n), as forget_from does.
 * Recurrent layers: dst's state becomes the one src kept after n positions (or src's live
 * state when it has seen exactly n), and dst keeps that copy; EI_ERR_STATE when src has neither. */
ei_status ei_runtime_copy_prefix(ei_runtime *rt, int src, int dst, int32_t n);
/* Recurrent layers: the slot's live state becomes the copy it kept after n positions (a keep row
 * of ei_forward); EI_ERR_STATE when none is kept there. The live state having seen n: no-op. */
ei_status ei_runtime_restore_state(ei_runtime *rt, int slot, int32_t n);
/* Frees the copy of the slot's recurrent state kept after n positions (none kept: no-op). */
ei_status ei_runtime_drop_state(ei_runtime *rt, int slot, int32_t n);

/* ---- A slot's state on the host (native/src/slot_io.c; owner: the prompt cache) ----
 * Positions [0, n) of a slot as one buffer: every KV-storing layer's cells as the arena holds
 * them (f16 or q8_0; a sliding-window layer's last swa_window positions) and, with recurrent
 * layers, the state after n positions. Its layout depends only on the model, the KV type and n.
 * Save: the slot must hold [0, n) unwrapped (EI_ERR_STATE otherwise; recurrent layers: a state kept
 * at n or a live state that has seen n). Load: the slot holds exactly [0, n) afterwards (and keeps
 * the recurrent state at n). size must equal ei_runtime_slot_state_size(rt, n). */
size_t ei_runtime_slot_state_size(const ei_runtime *rt, int32_t n);
ei_status ei_runtime_save_slot(ei_runtime *rt, int slot, int32_t n, void *buf, size_t size);
ei_status ei_runtime_load_slot(ei_runtime *rt, int slot, int32_t n, const void *buf, size_t size);
/* ---- end of a slot's state on the host ---- */

/* One step for a batch of tokens, possibly from several slots.
 * Token i (< n_tokens) of slot slots[i] sits at position pos[i] and its K/V
 * are written into cell cells[i] of that slot; it attends to every cell of
 * its slot whose position is <= pos[i] (its own included).
 * Logits are computed for the tokens listed in out_rows (n_out of them) and
 * written to logits[j * n_vocab ...] for j < n_out.
 * Recurrent layers: a slot's tokens come in position order, the first at the position its live
 * state has seen (EI_ERR_STATE otherwise); after each row listed in keep_rows (n_keep of them)
 * a copy of that slot's recurrent state is kept, named by pos + 1 (ei_runtime_restore_state). */
ei_status ei_forward(ei_runtime *rt, int32_t n_tokens, const int32_t *tokens,
                     const int32_t *slots, const int32_t *pos, const int32_t *cells,
                     int32_t n_out, const int32_t *out_rows, float *logits,
                     int32_t n_keep, const int32_t *keep_rows);
/* As ei_forward, but out gets each output row's hidden state after the final norm (n_embd floats,
 * hidden[j * n_embd ...]) in place of its logits: what embeddings pool. */
ei_status ei_forward_hidden(ei_runtime *rt, int32_t n_tokens, const int32_t *tokens,
                            const int32_t *slots, const int32_t *pos, const int32_t *cells,
                            int32_t n_out, const int32_t *out_rows, float *hidden,
                            int32_t n_keep, const int32_t *keep_rows);

/* ---- Qwen3.5's multi-token-prediction block as a draft (model.c, forward.c; owner: engine/mtp.py) ----
 * The block runs as a one-layer model whose input is eh_proj([enorm(embed(token)); hnorm(hidden)]),
 * hidden being the trunk's final-normed state one position earlier. */
enum { EI_NEXTN_EH_PROJ = 0, EI_NEXTN_ENORM = 1, EI_NEXTN_HNORM = 2 };
ei_status ei_model_set_nextn(ei_model *m, int which, const void *data, int type, int64_t ne0, int64_t ne1);
/* The model's runtimes read `trunk`'s packed output head (same tensor; trunk must outlive them). */
ei_status ei_model_share_head(ei_model *m, const ei_runtime *trunk);
/* As ei_forward on a model with the block's input tensors, row i's input combining tokens[i] with
 * hidden_in[i * n_embd ...]; hidden_out (may be NULL) gets each output row's final-normed state. */
ei_status ei_forward_nextn(ei_runtime *rt, int32_t n_tokens, const int32_t *tokens, const float *hidden_in,
                           const int32_t *slots, const int32_t *pos, const int32_t *cells,
                           int32_t n_out, const int32_t *out_rows, float *logits, float *hidden_out);
/* The final-normed hidden state (n_embd floats each) of rows of the latest ei_forward, before any other call runs. */
ei_status ei_runtime_last_hidden(const ei_runtime *rt, int32_t n_rows, const int32_t *rows, float *out);

/* ---- LoRA adapters (native/src/lora.c; owner: the engine's adapters) ----
 * An adapter holds float32 pairs for some of the model's matrices (copied at ei_lora_set): A [rank][ne0]
 * and B [ne1][rank] for a weight of ne1 rows of ne0 (scale folded into B or given per slot). A slot with adapters computes W x + sum_i scale_i B_i (A_i x) for every adapted W;
 * slots with different adapters share one forward. Detach (n = 0) before freeing an adapter. */
enum { EI_MAX_SLOT_LORAS = 8 };
typedef struct ei_lora ei_lora;
ei_status ei_lora_create(const ei_model *m, ei_lora **out);
ei_status ei_lora_set(ei_lora *a, int layer, int role, int32_t rank, const float *A, const float *B);
size_t ei_lora_bytes(const ei_lora *a);
void ei_lora_free(ei_lora *a);
ei_status ei_runtime_set_slot_loras(ei_runtime *rt, int slot, int n, ei_lora *const *loras, const float *scales);

/* ==== Quantization for the converter (native/src/quantize.c; owner: convert) ==== */
/* Bytes of one row of n_cols elements of `type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q4_K, Q5_K, Q6_K); n_cols must be a multiple of the type's block size. */
ei_status ei_quantize_row_bytes(int type, int64_t n_cols, int64_t *out);
/* dst = n_rows rows of n_cols float32 values from src, quantized to `type` (GGUF block
 * layout, rows contiguous), using up to n_threads threads (<= 0: physical cores). Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1 are bit-exact with the gguf package's quants.quantize.
 * `importance` (NULL, or n_cols finite values >= 0: an importance matrix's mean squared
 * activation per input column) weights each column's error in the searches of Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K and Q6_K as llama.cpp's quantizer weights it; Q8_0 and the float
 * types ignore it. */
ei_status ei_quantize_rows(int type, const float *src, void *dst, int64_t n_rows, int64_t n_cols,
                           const float *importance, int n_threads);
/* ==== end of quantization ==== */

#ifdef __cplusplus
}
#endif
#endif
