/* Runtime internals shared by runtime.c (allocation, KV bookkeeping) and forward.c. */
#ifndef EI_RUNTIME_H
#define EI_RUNTIME_H
#include <stdatomic.h>

#include "attention.h"
#include "kernels.h"
#include "model.h"
#include "threadpool.h"

typedef struct {
    int n;
    const struct ei_lora *lora[EI_MAX_SLOT_LORAS];
    float scale[EI_MAX_SLOT_LORAS];
} ei_slot_loras;

struct ei_runtime {
    const ei_model *m;
    ei_runtime_params p;
    const ei_kernels *kt;   /* the kernels of the ISA level, chosen at creation */
    ei_attn_kernel attn;    /* the attention kernel for this KV type and head size */
    ei_attn_kernel attn_swa; /* the sliding-window layers' (their head size: Gemma 4) */
    ei_pool *pool;

    /* The KV arena, allocated once: [layer][slot][kv_head][cell] rows of head_dim
     * values, f16 or Q8_0 blocks (kv_row_bytes per cell); a layer holds n_ctx cells per
     * slot, a sliding-window layer local_cells when it has its own ring. */
    uint8_t *k, *v;
    size_t kv_row_bytes, kv_row_bytes_swa;   /* a cell's row: full layers', sliding layers' head size */
    size_t *layer_off;   /* [n_layer]: byte offset of each layer's block in k and v */
    /* Sliding-window layers keep only their window: a ring of local_cells = swa_window +
     * max_batch - 1 cells per slot (a batch's earliest query still finds its window after
     * the batch's last token is stored), position p in cell p % local_cells. 0: the local
     * layers use the full ring (no window, or the window is not smaller than n_ctx). */
    int32_t local_cells;
    int32_t *local_cell_pos;  /* [slot][local_cells]: position held, -1 when empty */
    int32_t *local_used;      /* [slot]: local cells [0, local_used) may hold something */
    int32_t *cell_pos;   /* [slot][cell]: position held, -1 when empty */
    int32_t *n_used;     /* [slot]: cells [0, n_used) may hold something */
    size_t kv_bytes;

    /* Scratch for max_batch tokens, allocated once. */
    float *x, *xn, *q, *kc, *vc, *att, *gate, *up;
    void *act;           /* quantized activation rows (ei_act_row_bytes), max(n_embd, n_ff, q_dim) wide */
    float *scores;       /* [n_threads][2 * group * EI_ATTN_CHUNK] attention scores (of up to two tokens) */
    float *attn_part;    /* [attn_tokens][n_head][n_chunks][hd + 2] partial softmaxes */
    int32_t attn_tokens; /* tokens whose attention partials fit attn_part at once */
    atomic_int *attn_done; /* [attn_tokens][n_head_kv]: chunks finished; the last one merges */
    float *rope_cos, *rope_sin;  /* [max_batch][rope_dim / 2] */
    double *rope_freq;           /* [rope_dim / 2]: scale * theta^(-2i/rope_dim) / factor_i, fixed at creation */
    float *out_rows;     /* [max_batch][n_embd]: normed hidden rows for logits */
    float *nextn_in;     /* [max_batch][2 n_embd]: an MTP block's normed [embedding; hidden] rows; NULL without */
    int32_t last_n;      /* rows of the latest forward whose final residual rt->x still holds (ei_runtime_last_hidden) */
    /* Sliding-window layers (NULL without them): [n_threads][n_ctx] cell positions masked to a
     * query's window; the local layers' RoPE tables when their base differs from rope_theta. */
    int32_t *swa_cell_pos;
    float *rope_cos_l, *rope_sin_l;
    double *rope_freq_local;
    /* Per-layer inputs (Gemma 4; NULL without): [max_batch][n_layer][n_embd_per_layer] for this batch,
     * and one layer's gate and input rows [max_batch][n_embd_per_layer] (per_layer.c). */
    float *ple, *ple_gate, *ple_in;
    size_t scratch_bytes;
    double prof[EI_PROF_COUNT];   /* seconds per stage */

    /* Recurrent layers' states (state.c), allocated once; NULL without recurrent layers. Per
     * slot state_floats floats, layer l's block at state_off[l] (ei_layer_state_floats): the
     * live state in `state` [slot], kept copies in `snap` [slot][n_snapshots]. */
    float *state, *snap;
    int64_t state_floats;
    int64_t *state_off;    /* [n_layer] */
    int32_t *state_seen;   /* [slot]: positions the live state has seen; -1: none until restored */
    int32_t *snap_n;       /* [slot][n_snapshots]: positions a kept copy has seen; -1: free */
    int32_t *keep_snap;    /* [max_batch]: the kept copy a row of this forward fills, -1: none */
    float *rec_a, *rec_b;  /* recurrent layers' scratch: [max_batch][3 n_embd], [2][max_batch][n_embd] */
    float **conv_taps;     /* [n_layer]: a recurrent layer's conv taps, tap-major [conv_kernel][channels] */
    float *taps_arena;
    float *dn_buf;         /* delta-net layers' scratch (recurrent.c, ei_deltanet_scratch_floats) */
    float *attn_gate;      /* [max_batch][q_dim]: gated attention's output gates (has_attn_gate); NULL without */
    size_t state_bytes;

    /* Row-interleaved copies of the weights the kernels can use packed (packed.h);
     * NULL where a weight stays in its GGUF layout. One arena holds them all. */
    const void **packed;  /* [n_layer * EI_PACKED_PER_LAYER + 1]; the last is the output head */
    void *pack_arena;
    size_t pack_bytes;
    void *embd_row;   /* a tied embedding's row read back from the packed head (embed); NULL: the lookup reads the GGUF bytes */

    /* LoRA adapters per slot (lora.c); NULL until one is attached. During a forward whose batch has a
     * slot with adapters, lora_slots gives the slot of each row the matmuls see (NULL otherwise). */
    ei_slot_loras *slot_lora;          /* [n_slots] */
    const int32_t *lora_slots;
    const struct ei_lora **lora_seen;  /* [n_slots]: the batch's distinct adapters at one place of the slots' lists */
    int64_t *lora_rows;                /* [max_batch]: rows of one adapter */
    float *lora_row_scale;             /* [max_batch] */
    int32_t *lora_head_slots;          /* [max_batch]: the slot of each output row of the head */
    float *lora_buf;                   /* gathered x rows, their A x and scale * A x */
    size_t lora_floats;
    int64_t lora_max_in, lora_max_rank;
};

enum { EI_PK_Q, EI_PK_K, EI_PK_V, EI_PK_O, EI_PK_GATE, EI_PK_UP, EI_PK_DOWN, EI_PACKED_PER_LAYER };

/* Byte offset of cell 0 of (slot, layer, kv_head) in the K or V arena. */
/* Does layer use the local ring (rather than the full one)? */
static inline int ei_layer_in_local_ring(const struct ei_runtime *rt, int layer) {
    return rt->local_cells > 0 && ei_layer_is_local(&rt->m->cfg, layer);
}

/* EI_OK when the slot holds positions [0, n) in cells [0, n) (the prefix never wrapped) and its
 * sliding-window ring still holds the window the next token sees; else EI_ERR_STATE naming which. */
ei_status ei_check_prefix(const struct ei_runtime *rt, int slot, int32_t n);

/* First position a layer keeps of a prefix of n. */
static inline int32_t ei_first_kept(const struct ei_runtime *rt, int layer, int32_t n) {
    return ei_layer_is_local(&rt->m->cfg, layer) ? ei_window_first(&rt->m->cfg, n) : 0;
}

/* The cell of (slot, layer) holding position p, given the slot holds it. */
static inline size_t ei_cell_of(const struct ei_runtime *rt, int layer, int32_t p) {
    return ei_layer_in_local_ring(rt, layer) ? (size_t)(p % rt->local_cells) : (size_t)p;
}

/* KV cells per slot a layer stores: none for a recurrent or KV-shared layer, its window's for a local ring. */
static inline size_t ei_layer_cells(const struct ei_runtime *rt, int layer) {
    if (!ei_layer_stores_kv(&rt->m->cfg, layer)) return 0;
    return ei_layer_in_local_ring(rt, layer) ? (size_t)rt->local_cells : (size_t)rt->p.n_ctx;
}

/* Bytes of one cell's K (or V) row of a head of layer `layer` (its head size). */
static inline size_t ei_layer_kv_row_bytes(const struct ei_runtime *rt, int layer) {
    return ei_layer_head_dim(&rt->m->cfg, layer) == rt->m->cfg.head_dim ? rt->kv_row_bytes : rt->kv_row_bytes_swa;
}

/* Byte offset of cell 0 of (slot, kv_head) of the KV that `layer` reads: its own, or its source layer's. */
static inline size_t ei_kv_offset(const struct ei_runtime *rt, int slot, int layer, int kvh) {
    const ei_model_config *c = &rt->m->cfg;
    const int src = ei_layer_kv_source(c, layer);
    const size_t cells = ei_layer_cells(rt, src);
    return rt->layer_off[src] + (((size_t)slot * c->n_head_kv + kvh) * cells) * ei_layer_kv_row_bytes(rt, src);
}

/* y[t, r] = W[r] . x[t] for up to three weights sharing one input, across the pool. */
typedef struct {
    const ei_weight *w;
    float *y;            /* [n_tok][w->ne1] */
    const void *packed;  /* packed copy of w, or NULL */
} ei_mm_job;

void ei_parallel_matmul(struct ei_runtime *rt, const ei_mm_job *jobs, int n_jobs, const float *x,
                        int64_t n_tok);
/* The same without the adapters' updates (what the adapters' own small matmuls use). */
void ei_matmul_base(struct ei_runtime *rt, const ei_mm_job *jobs, int n_jobs, const float *x, int64_t n_tok);
/* Adds each row's adapters' updates to the jobs' outputs (lora.c); rt->lora_slots must be set. */
void ei_lora_apply(struct ei_runtime *rt, const ei_mm_job *jobs, int n_jobs, const float *x, int64_t n_rows);

/* Gemma 4's per-layer inputs (per_layer.c): scratch at creation, this batch's inputs after the
 * embedding (rt->x), and a layer's per-layer block on rt->x after its FFN (with the block's output scale). */
int ei_per_layer_alloc(struct ei_runtime *rt, size_t *scratch);
/* out[0..n) = x * w / rms(x) (forward.c); out may be x. */
void ei_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
ei_status ei_per_layer_inputs(struct ei_runtime *rt, const int32_t *tokens, int64_t n_tok);
void ei_per_layer_block(struct ei_runtime *rt, int layer, int64_t n_tok);
#endif
