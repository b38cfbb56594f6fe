/* The CUDA runtime: device queries, weight upload, the KV ring in device
 * memory, and the per-step forward pass (ei_forward's contract).
 *
 * KV bookkeeping (cell_pos, n_used per slot) is mirrored on the host, as the
 * CPU runtime keeps it, and the device copy of cell_pos is updated by the step
 * itself (rope_tables) or by clear/forget. Decode-sized steps (n_tokens <= 16)
 * are captured once per (n_tokens, n_out) as CUDA Graphs and replayed: their
 * launch parameters never change (the batch lives in fixed device buffers and
 * attention spans every chunk of the ring, empty chunks exiting at once). */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "edgeinfer_layout.h"
#include "kernels.cuh"

static thread_local char g_err[1024];

extern "C" const char *ei_cuda_last_error(void) { return g_err; }
extern "C" const char *ei_cuda_version(void) { return "edgeinfer-cuda " EI_VERSION; }

ei_status eic_fail(ei_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return st;
}

ei_status eic_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return EI_OK;
    const ei_status st = e == cudaErrorMemoryAllocation ? EI_ERR_OUT_OF_MEMORY : EI_ERR_STATE;
    return eic_fail(st, "%s: CUDA error %d (%s): %s", what, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define MiB(x) ((double)(x) / 1048576.0)

/* ---------------------------------------------------------------- devices */
extern "C" int ei_cuda_device_count(void) {
    int drv = 0;
    cudaError_t e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || drv == 0) {
        eic_fail(EI_ERR_UNSUPPORTED, "no NVIDIA driver (libcuda) found%s%s", e != cudaSuccess ? ": " : "",
                 e != cudaSuccess ? cudaGetErrorString(e) : "");
        return -1;
    }
    int n = 0;
    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        int rt = 0;
        cudaRuntimeGetVersion(&rt);
        eic_fail(EI_ERR_UNSUPPORTED, "CUDA unusable (driver %d.%d, runtime %d.%d): %s", drv / 1000, drv % 1000 / 10,
                 rt / 1000, rt % 1000 / 10, cudaGetErrorString(e));
        return -1;
    }
    if (n == 0) {
        eic_fail(EI_ERR_UNSUPPORTED, "the NVIDIA driver sees no CUDA device");
        return -1;
    }
    return n;
}

extern "C" int ei_cuda_get_device_info(int device, ei_cuda_device_info *out) {
    if (!out) return eic_fail(EI_ERR_INVALID_ARG, "device_info: null output");
    memset(out, 0, sizeof *out);
    const int n = ei_cuda_device_count();
    if (n < 0) return EI_ERR_UNSUPPORTED;
    if (device < 0 || device >= n) return eic_fail(EI_ERR_RANGE, "device %d outside [0, %d)", device, n);
    cudaDeviceProp prop;
    ei_status st = eic_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    if (st != EI_OK) return st;
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->sm_count = prop.multiProcessorCount;
    out->integrated = prop.integrated;
    out->total_bytes = prop.totalGlobalMem;
    int prev = 0;
    cudaGetDevice(&prev);
    if ((st = eic_check(cudaSetDevice(device), "cudaSetDevice")) != EI_OK) return st;
    size_t fr = 0, tot = 0;
    st = eic_check(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
    cudaSetDevice(prev);
    if (st != EI_OK) return st;
    out->free_bytes = fr;
    out->total_bytes = tot;
    int v = 0;
    cudaDriverGetVersion(&v);
    out->driver_version = v;
    cudaRuntimeGetVersion(&v);
    out->runtime_version = v;
    return EI_OK;
}

/* ---------------------------------------------------------------- the runtime */
/* The roles a LoRA pair may adapt: the matmuls of the CUDA forward. */
static const int LORA_ROLES[] = {EI_T_ATTN_Q,   EI_T_ATTN_K, EI_T_ATTN_V,    EI_T_ATTN_OUTPUT,
                                 EI_T_FFN_GATE, EI_T_FFN_UP, EI_T_FFN_DOWN, EI_T_OUTPUT};
enum { N_LORA_ROLES = sizeof LORA_ROLES / sizeof LORA_ROLES[0] };

typedef struct {
    float *a, *b;   /* device: A [rank][ne0], B [ne1][rank] */
    int32_t rank;
    int64_t ne0, ne1;   /* the adapted weight's */
} eic_lora_pair;

struct ei_cuda_lora {
    const struct ei_cuda_runtime *rt;
    int device;
    int32_t n_layer, max_rank;
    eic_lora_pair *pairs;   /* [(n_layer + 1) * N_LORA_ROLES]: layer l's role k at l * N + k, the head at n_layer */
    size_t bytes;
};

typedef struct {
    int n;
    const ei_cuda_lora *lora[EI_MAX_SLOT_LORAS];
    float scale[EI_MAX_SLOT_LORAS];
} eic_slot_loras;

enum { MAX_GRAPH_TOKENS = 16, MAX_SLOTS = 4096, MAX_CTX = 1 << 20, MAX_BATCH = 1 << 16 };
/* Device batch arrays: tokens, slots, pos, cells, n_cells, out_rows, for the sliding-window
 * layers' ring their cells and n_cells, and the kept state copy of each row (-1: none). */
#define EIC_BATCH_ARRAYS 9

struct ei_cuda_runtime {
    ei_model_config cfg;
    ei_cuda_params p;
    cudaStream_t stream;
    ei_globals globals;        /* weights: device pointers into w_arena */
    ei_layer *layers;
    void *w_arena;
    ei_cuda_sizes sizes;

    eic_kv kv;                 /* device arena */
    int32_t *d_cell_pos;       /* [slot][cell] */
    int32_t *h_cell_pos, *h_n_used;
    /* Sliding-window layers keep only their window (as the CPU runtime): a second arena of
     * local_cells = swa_window + max_batch - 1 cells per slot, position p in cell p %
     * local_cells; 0 when they use the full ring. kv holds the other layers. */
    eic_kv kv_l;
    int32_t local_cells, max_chunks_l;
    /* [n_layer]: the KV an attention layer reads, as a one-layer view into kv or kv_l: its own, or for a
     * KV-shared layer (Gemma 4) its source layer's. Layer-major arenas: each storing layer's block is
     * [slot][kv_head][cell][its head size], so two head sizes share one arena. */
    eic_kv *kv_view;
    float *out_scale;          /* [n_layer]: each layer's output scale (Gemma 4; 1 when absent), read at upload */
    int32_t *d_cell_pos_l, *h_cell_pos_l, *h_n_used_l;

    /* device batch: tokens, slots, pos, cells, n_cells, out_rows; each max_batch int32 */
    int32_t *d_batch, *h_batch;   /* h_batch is pinned */
    float *x, *q, *kc, *vc, *att, *gate, *up, *rope_cos, *rope_sin, *onorm, *logits, *part;
    float *rope_cos_l, *rope_sin_l;   /* local layers' RoPE tables when their base differs; else NULL */
    float *post;                      /* [max_batch][n_embd]: a block's output before its post-norm */
    int32_t *d_top_ids;        /* argmax / top-k results: max_batch x EIC_TOPK_MAX each */
    float *d_top_vals;
    int32_t attn_tokens, max_chunks, last_n_out;

    cudaGraphExec_t graphs[MAX_GRAPH_TOKENS + 1][MAX_GRAPH_TOKENS + 1];   /* [n_tokens][n_out] */
    int graphs_broken;

    /* LoRA adapters per slot (NULL until one is attached), and a step's groups (lora_plan): each
     * distinct adapter of the batch with its rows and their scales, [group][2][max_batch] (the
     * batch's token rows, then the head's output rows), on the host and on the device. */
    eic_slot_loras *slot_lora;
    const ei_cuda_lora **lora_group;
    int32_t *lora_count;                 /* [group][2] */
    int32_t *h_lora_rows, *d_lora_rows;
    float *h_lora_scale, *d_lora_scale;
    float *d_lora_t;                     /* [max_batch][lora_rank]: A x of one group */
    int32_t n_lora_groups, lora_cap, lora_rank;

    /* Recurrent layers (LFM2, Qwen3.5): each slot's live state [slot][state_floats] and its n_snap
     * kept copies [slot][n_snap][state_floats] on the device, layer l's block at state_off[l] (the
     * CPU's layout, native/src/state.c); which positions each has seen is kept on the host. */
    float *d_state, *d_snap;
    int64_t state_floats, *state_off;
    int32_t n_snap;
    int32_t *state_seen, *snap_n;   /* [slot], [slot][n_snap]: positions seen (-1: none / forgotten) */
    float *rec_a, *rec_b;           /* the recurrent blocks' scratch */
    /* A step's runs of rows of one slot, cut after each keep row (recurrent.c's run_end): [run][first,
     * count]; long_runs: some run has EI_DELTA_CHUNK rows or more (its delta rule goes by chunks). */
    int32_t *h_runs, n_runs, long_runs;
    float *qg, *agate;              /* gated attention: attn_q's rows (query, gate) and the gates */

    /* Gemma 4's per-layer inputs. The table (n_vocab rows of n_layer x n_embd_per_layer) stays in the
     * host's file mapping, as on the CPU: each step copies its tokens' quantized rows into a pinned
     * buffer and up to d_ple_rows (the whole table would double the device memory of an E2B model for
     * the few rows a step reads). ple: the step's inputs [T][n_layer][e]; ple_in: the projection's
     * scratch, then the rows dequantized; ple_gate: [T][e]. */
    const uint8_t *ple_host;
    int64_t ple_row_bytes;
    int32_t ple_type;
    uint8_t *h_ple_rows, *d_ple_rows;
    int32_t *d_iota;                /* 0, 1, ..., max_batch - 1: the staged rows' indices */
    float *ple, *ple_in, *ple_gate;
};

static int32_t *batch_arr(const ei_cuda_runtime *rt, int32_t *base, int i) {
    return base + (size_t)i * rt->p.max_batch;
}

/* Device bytes of a tensor: vectors are stored as f32, matrices as they are. */
static int64_t dev_bytes(const ei_cuda_tensor *t) {
    if (ei_role_is_vector(t->role)) return t->ne0 * t->ne1 * 4;
    int e, b;
    if (!eic_type_block(t->type, &e, &b)) return -1;
    const int64_t row = eic_row_bytes(t->type, t->ne0);
    return row > 0 ? row * t->ne1 : -1;
}

static float host_h2f(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);
    else if (exp) bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) bits = sign;
    else {
        float f = (float)man * (1.0f / 16777216.0f);
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void drop_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

extern "C" void ei_cuda_runtime_free(ei_cuda_runtime *rt) {
    if (!rt) return;
    for (int i = 0; i <= MAX_GRAPH_TOKENS; i++)
        for (int j = 0; j <= MAX_GRAPH_TOKENS; j++)
            if (rt->graphs[i][j]) cudaGraphExecDestroy(rt->graphs[i][j]);
    void *dev[] = {rt->w_arena, rt->kv.k, rt->kv.v, rt->d_cell_pos, rt->d_batch, rt->x, rt->q, rt->kc, rt->vc,
                   rt->att, rt->gate, rt->up, rt->rope_cos, rt->rope_sin, rt->onorm, rt->logits, rt->part,
                   rt->d_top_ids, rt->d_top_vals, rt->rope_cos_l, rt->rope_sin_l, rt->post, rt->kv_l.k, rt->kv_l.v,
                   rt->d_cell_pos_l, rt->d_lora_rows, rt->d_lora_scale, rt->d_lora_t, rt->d_state, rt->d_snap,
                   rt->rec_a, rt->rec_b, rt->qg, rt->agate, rt->d_ple_rows, rt->d_iota, rt->ple, rt->ple_in,
                   rt->ple_gate};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) cudaFree(dev[i]);
    if (rt->h_batch) cudaFreeHost(rt->h_batch);
    if (rt->h_ple_rows) cudaFreeHost(rt->h_ple_rows);
    if (rt->stream) cudaStreamDestroy(rt->stream);
    free(rt->h_cell_pos);
    free(rt->h_n_used);
    free(rt->h_cell_pos_l);
    free(rt->h_n_used_l);
    free(rt->kv_view);
    free(rt->out_scale);
    free(rt->layers);
    free(rt->slot_lora);
    free((void *)rt->lora_group);
    free(rt->lora_count);
    free(rt->h_lora_rows);
    free(rt->h_lora_scale);
    free(rt->state_off);
    free(rt->state_seen);
    free(rt->h_runs);
    free(rt->snap_n);
    free(rt);
}

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Gemma 4's per-layer token embedding: left in the host mapping (ei_cuda_runtime's ple_host). */
static int is_ple_table(const ei_cuda_tensor *t) { return t->layer < 0 && t->role == EI_T_PER_LAYER_TOKEN_EMBD; }

extern "C" ei_status ei_cuda_runtime_create(const ei_model_config *cfg, const ei_cuda_tensor *tensors,
                                            int32_t n_tensors, const ei_cuda_params *p, ei_cuda_sizes *sizes,
                                            ei_cuda_runtime **out) {
    if (!cfg || !p || !out || (n_tensors > 0 && !tensors))
        return eic_fail(EI_ERR_INVALID_ARG, "cuda_runtime_create: null argument");
    *out = NULL;
    const ei_model_config *c = cfg;
    char msg[256];
    if (ei_config_check(c, msg, sizeof msg) != EI_OK)
        return eic_fail(EI_ERR_INVALID_ARG, "cuda_runtime_create: inconsistent model configuration: %s", msg);
    int n_rec = 0;
    for (int l = 0; l < c->n_layer; l++) n_rec += ei_layer_is_recurrent(c, l);
    if (n_rec && (c->conv_kernel < 2 || c->conv_kernel > EIC_CONV_MAX_K || c->ssm_head_dim > EIC_MAX_SSM_DK))
        return eic_fail(EI_ERR_UNSUPPORTED, "CUDA recurrent layers support conv kernels of 2..%d taps and delta-net "
                                            "heads <= %d (got %d, %d)", EIC_CONV_MAX_K, EIC_MAX_SSM_DK,
                        c->conv_kernel, c->ssm_head_dim);
    if (c->has_attn_gate && c->has_qkv_bias)
        return eic_fail(EI_ERR_UNSUPPORTED, "the CUDA runtime has no gated attention with Q/K/V biases");
    if (n_rec && (p->n_snapshots < 0 || p->n_snapshots > 4096))
        return eic_fail(EI_ERR_INVALID_ARG, "cuda_runtime_create: n_snapshots=%d out of [0, 4096]", p->n_snapshots);
    if (c->head_dim > EIC_MAX_HEAD_DIM || c->n_head / c->n_head_kv > EIC_MAX_GROUP)
        return eic_fail(EI_ERR_UNSUPPORTED, "CUDA attention supports head_dim <= %d and GQA groups <= %d (got %d, %d)",
                        EIC_MAX_HEAD_DIM, EIC_MAX_GROUP, c->head_dim, c->n_head / c->n_head_kv);
    if (p->n_slots < 1 || p->n_slots > MAX_SLOTS || p->n_ctx < 1 || p->n_ctx > MAX_CTX || p->max_batch < 1 ||
        p->max_batch > MAX_BATCH)
        return eic_fail(EI_ERR_INVALID_ARG, "cuda_runtime_create: n_slots=%d n_ctx=%d max_batch=%d out of range",
                        p->n_slots, p->n_ctx, p->max_batch);
    if (p->n_sink < 0 || p->n_sink >= p->n_ctx || p->slide_window < 0 || p->slide_window > p->n_ctx - p->n_sink)
        return eic_fail(EI_ERR_INVALID_ARG, "cuda_runtime_create: n_sink=%d slide_window=%d out of range for n_ctx=%d",
                        p->n_sink, p->slide_window, p->n_ctx);

    /* ---- size everything before allocating anything on the device ---- */
    size_t wbytes = 0;
    const ei_cuda_tensor *ple = NULL;
    for (int32_t i = 0; i < n_tensors; i++) {
        const ei_cuda_tensor *t = &tensors[i];
        if (!t->data || t->ne0 < 1 || t->ne1 < 1)
            return eic_fail(EI_ERR_INVALID_ARG, "tensor %d (role %d): null data or bad shape", i, t->role);
        if (ei_role_is_vector(t->role) && t->type != EI_TYPE_F32 && t->type != EI_TYPE_F16 && t->type != EI_TYPE_BF16)
            return eic_fail(EI_ERR_UNSUPPORTED, "tensor %d (role %d): type %d for a vector", i, t->role, t->type);
        const int64_t b = dev_bytes(t);
        if (b <= 0)
            return eic_fail(EI_ERR_UNSUPPORTED, "tensor %d (layer %d, role %d): type %d with rows of %lld has no CUDA kernel",
                            i, t->layer, t->role, t->type, (long long)t->ne0);
        if (is_ple_table(t)) {   /* stays on the host: a step uploads its rows */
            ple = t;
            continue;
        }
        wbytes += al256((size_t)b);
    }
    const size_t e_ple = (size_t)c->n_embd_per_layer, ple_all = e_ple * c->n_layer;
    const size_t ple_rb = ple ? (size_t)eic_row_bytes(ple->type, ple->ne0) : 0;
    const size_t B = (size_t)p->max_batch, d = (size_t)c->n_embd, qd = (size_t)c->n_head * c->head_dim;
    /* the widest layer's sizes (head_dim >= head_dim_swa, n_ff >= every n_ff_per_layer: ei_config_check) */
    const int rope_max = c->rope_dim > c->rope_dim_swa ? c->rope_dim : c->rope_dim_swa;
    const size_t kvd = (size_t)c->n_head_kv * c->head_dim, ff = (size_t)c->n_ff, half = rope_max / 2 ? rope_max / 2 : 1;
    /* sliding-window layers: their own ring when window + max_batch - 1 < n_ctx */
    const int32_t local_cells = c->swa_window > 0 && (int64_t)c->swa_window + p->max_batch - 1 < p->n_ctx
                                    ? c->swa_window + p->max_batch - 1 : 0;
    int n_local = 0;   /* KV is held by the attention layers that store their own (not KV-shared ones) */
    size_t kv_elems = 0, kv_elems_l = 0;
    for (int l = 0; l < c->n_layer; l++) {
        if (!ei_layer_stores_kv(c, l)) continue;
        const size_t per = (size_t)p->n_slots * c->n_head_kv * ei_layer_head_dim(c, l);
        if (local_cells && ei_layer_is_local(c, l)) {
            n_local++;
            kv_elems_l += per * (size_t)local_cells;
        } else {
            kv_elems += per * (size_t)p->n_ctx;
        }
    }
    /* the cells' bytes (the CPU runtime's figure); the arenas' padding counts in the total */
    const size_t kv_bytes = 2 * (kv_elems + kv_elems_l) * 2;
    const size_t kv_alloc = 2 * al256(kv_elems * 2) + (n_local ? 2 * al256(kv_elems_l * 2) : 0);
    const int max_chunks = (p->n_ctx + EIC_ATTN_CHUNK - 1) / EIC_ATTN_CHUNK;
    const size_t part_per_tok = (size_t)c->n_head * max_chunks * EIC_PART_FLOATS(c->head_dim) * sizeof(float);
    size_t attn_tokens = ((size_t)64 << 20) / part_per_tok;   /* partials of at most ~64 MiB at once */
    if (attn_tokens < 1) attn_tokens = 1;
    if (attn_tokens > B) attn_tokens = B;
    if (attn_tokens > 65535) attn_tokens = 65535;
    int has_freqs = 0;   /* rope_freqs: the global layers' factors, not the local ones' */
    for (int32_t i = 0; i < n_tensors; i++) has_freqs |= tensors[i].layer < 0 && tensors[i].role == EI_T_ROPE_FREQS;
    const int local_rope = c->swa_window > 0 && ((c->rope_theta_local > 0 && c->rope_theta_local != c->rope_theta) ||
                                                 c->rope_freq_scale != 1.0f || has_freqs ||
                                                 (c->rope_dim_swa > 0 && c->rope_dim_swa != c->rope_dim));
    /* the recurrent states: per layer a block padded to 16 floats (as the CPU) */
    int64_t state_floats = 0;
    for (int l = 0; l < c->n_layer; l++) state_floats += (ei_layer_state_floats(c, l) + 15) & ~(int64_t)15;
    const int32_t n_snap = state_floats ? p->n_snapshots : 0;
    const size_t state_bytes = (size_t)p->n_slots * (1 + (size_t)n_snap) * (size_t)state_floats * 4;
    /* recurrent scratch per token: short conv B, C, x then its output; delta net qkv, z, alpha, beta
     * then the conv's output and o */
    size_t rec_a = 0, rec_b = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const size_t cd = (size_t)ei_deltanet_conv_dim(c), inner = (size_t)ei_deltanet_inner(c);
        const int kind = ei_layer_kind_of(c, l);
        const size_t a = kind == EI_LAYER_SHORTCONV ? 3 * d : kind == EI_LAYER_DELTANET ? cd + inner + 2 * c->ssm_v_heads : 0;
        const size_t b = kind == EI_LAYER_SHORTCONV ? d : kind == EI_LAYER_DELTANET ? cd + inner : 0;
        if (a > rec_a) rec_a = a;
        if (b > rec_b) rec_b = b;
    }
    const size_t scr[] = {EIC_BATCH_ARRAYS * B * 4,  B * d * 4,  B * qd * 4,   B * kvd * 4,  B * kvd * 4, B * qd * 4,
                          B * ff * 4, B * ff * 4, B * half * 4, B * half * 4, B * d * 4,
                          B * (size_t)c->n_vocab * 4, attn_tokens * part_per_tok, B * EIC_TOPK_MAX * 4,
                          B * EIC_TOPK_MAX * 4,
                          (size_t)p->n_slots * p->n_ctx * 4,
                          /* local RoPE tables and the post-norm buffer, when the model has them */
                          local_rope ? B * half * 4 : 0, local_rope ? B * half * 4 : 0,
                          c->has_post_norms || e_ple ? B * d * 4 : 0,
                          n_local ? (size_t)p->n_slots * local_cells * 4 : 0,
                          B * rec_a * 4, B * rec_b * 4, c->has_attn_gate ? 2 * B * qd * 4 : 0,
                          c->has_attn_gate ? B * qd * 4 : 0,
                          /* per-layer inputs: ple, ple_in, ple_gate, the staged rows, d_iota */
                          B * ple_all * 4, B * ple_all * 4, B * e_ple * 4, B * ple_rb, e_ple ? B * 4 : 0};
    size_t scratch = 0;
    for (size_t i = 0; i < sizeof scr / sizeof scr[0]; i++) scratch += al256(scr[i]);
    ei_cuda_sizes sz = {wbytes, kv_bytes, scratch, wbytes + kv_alloc + scratch + state_bytes, state_bytes};
    if (sizes) *sizes = sz;

    int n_dev = ei_cuda_device_count();
    if (n_dev < 0) return EI_ERR_UNSUPPORTED;
    if (p->device < 0 || p->device >= n_dev) return eic_fail(EI_ERR_RANGE, "CUDA device %d outside [0, %d)", p->device, n_dev);
    ei_status st = eic_check(cudaSetDevice(p->device), "cudaSetDevice");
    if (st != EI_OK) return st;
    size_t fr = 0, tot = 0;
    if ((st = eic_check(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo")) != EI_OK) return st;
    {   /* attention's shared memory for the widest heads */
        const size_t g = (size_t)(c->n_head / c->n_head_kv), smem = EIC_ATTN_SMEM(g, (size_t)c->head_dim);
        cudaDeviceProp prop = {};
        if ((st = eic_check(cudaGetDeviceProperties(&prop, p->device), "cudaGetDeviceProperties")) != EI_OK) return st;
        if (smem > prop.sharedMemPerBlockOptin)
            return eic_fail(EI_ERR_UNSUPPORTED, "CUDA attention over heads of %d in groups of %d needs %zu bytes of shared "
                                                "memory per block; %s allows %zu", c->head_dim, (int)g, smem, prop.name,
                            (size_t)prop.sharedMemPerBlockOptin);
    }
    const size_t reserve = (size_t)256 << 20;   /* context, graphs, kernels' own needs */
    if (sz.total + reserve > fr) {
        cudaDeviceProp prop = {};   /* zeroed: if the query fails, name is "" rather than stack garbage */
        if (cudaGetDeviceProperties(&prop, p->device) != cudaSuccess) cudaGetLastError();
        return eic_fail(EI_ERR_OUT_OF_MEMORY,
                        "model does not fit on %s: needs %.1f MiB (weights %.1f + KV %.1f for %d slots x %d cells + "
                        "recurrent state %.1f + scratch %.1f for max_batch %d) plus %.0f MiB reserve, but only %.1f MiB "
                        "of %.1f MiB are free; lower n_ctx, n_slots or max_batch, or use a smaller quantization",
                        prop.name, MiB(sz.total), MiB(wbytes), MiB(kv_bytes), p->n_slots, p->n_ctx, MiB(state_bytes),
                        MiB(scratch), p->max_batch, MiB(reserve), MiB(fr), MiB(tot));
    }

    /* ---- allocate ---- */
    ei_cuda_runtime *rt = (ei_cuda_runtime *)calloc(1, sizeof *rt);
    if (!rt) return eic_fail(EI_ERR_OUT_OF_MEMORY, "cuda_runtime_create: out of host memory");
    rt->cfg = *c;
    rt->p = *p;
    rt->sizes = sz;
    rt->max_chunks = max_chunks;
    rt->attn_tokens = (int32_t)attn_tokens;
    rt->graphs_broken = !p->use_graphs;
    rt->layers = (ei_layer *)calloc((size_t)c->n_layer, sizeof(ei_layer));
    rt->h_cell_pos = (int32_t *)malloc((size_t)p->n_slots * p->n_ctx * sizeof(int32_t));
    rt->h_n_used = (int32_t *)calloc((size_t)p->n_slots, sizeof(int32_t));
    rt->kv_view = (eic_kv *)calloc((size_t)c->n_layer, sizeof(eic_kv));
    rt->out_scale = (float *)malloc((size_t)c->n_layer * sizeof(float));
    for (int l = 0; rt->out_scale && l < c->n_layer; l++) rt->out_scale[l] = 1.0f;
    rt->state_off = (int64_t *)calloc((size_t)c->n_layer, sizeof(int64_t));
    rt->state_floats = state_floats;
    rt->n_snap = n_snap;
    if (state_floats) {
        rt->state_seen = (int32_t *)calloc((size_t)p->n_slots, sizeof(int32_t));
        rt->h_runs = (int32_t *)malloc((size_t)p->max_batch * 2 * sizeof(int32_t));
        rt->snap_n = (int32_t *)malloc(((size_t)p->n_slots * n_snap + 1) * sizeof(int32_t));
        for (size_t i = 0; rt->snap_n && i < (size_t)p->n_slots * n_snap; i++) rt->snap_n[i] = -1;
    }
    for (int64_t l = 0, off = 0; rt->state_off && l < c->n_layer; l++) {
        rt->state_off[l] = off;
        off += (ei_layer_state_floats(c, (int)l) + 15) & ~(int64_t)15;
    }
    if (n_local) {
        rt->local_cells = local_cells;
        rt->max_chunks_l = (local_cells + EIC_ATTN_CHUNK - 1) / EIC_ATTN_CHUNK;
        rt->h_cell_pos_l = (int32_t *)malloc((size_t)p->n_slots * local_cells * sizeof(int32_t));
        rt->h_n_used_l = (int32_t *)calloc((size_t)p->n_slots, sizeof(int32_t));
    }
    if (!rt->layers || !rt->h_cell_pos || !rt->h_n_used || !rt->kv_view || !rt->out_scale || !rt->state_off ||
        (state_floats && (!rt->state_seen || !rt->snap_n || !rt->h_runs)) ||
        (n_local && (!rt->h_cell_pos_l || !rt->h_n_used_l))) {
        ei_cuda_runtime_free(rt);
        return eic_fail(EI_ERR_OUT_OF_MEMORY, "cuda_runtime_create: out of host memory");
    }
    for (size_t i = 0; i < (size_t)p->n_slots * p->n_ctx; i++) rt->h_cell_pos[i] = -1;
    for (size_t i = 0; n_local && i < (size_t)p->n_slots * local_cells; i++) rt->h_cell_pos_l[i] = -1;

#define DALLOC(ptr, bytes)                                                                       \
    if ((st = eic_check(cudaMalloc((void **)&(ptr), al256(bytes)), "cudaMalloc " #ptr)) != EI_OK) \
        goto fail;
    if ((st = eic_check(cudaStreamCreateWithFlags(&rt->stream, cudaStreamNonBlocking), "cudaStreamCreate")) != EI_OK)
        goto fail;
    DALLOC(rt->w_arena, wbytes ? wbytes : 256);
    DALLOC(rt->kv.k, kv_elems * 2);
    DALLOC(rt->kv.v, kv_elems * 2);
    if (n_local) {
        DALLOC(rt->kv_l.k, kv_elems_l * 2);
        DALLOC(rt->kv_l.v, kv_elems_l * 2);
        DALLOC(rt->d_cell_pos_l, (size_t)p->n_slots * local_cells * 4);
    }
    DALLOC(rt->d_cell_pos, (size_t)p->n_slots * p->n_ctx * 4);
    DALLOC(rt->d_batch, EIC_BATCH_ARRAYS * B * 4);
    DALLOC(rt->x, B * d * 4);
    DALLOC(rt->q, B * qd * 4);
    DALLOC(rt->kc, B * kvd * 4);
    DALLOC(rt->vc, B * kvd * 4);
    DALLOC(rt->att, B * qd * 4);
    DALLOC(rt->gate, B * ff * 4);
    DALLOC(rt->up, B * ff * 4);
    DALLOC(rt->rope_cos, B * half * 4);
    DALLOC(rt->rope_sin, B * half * 4);
    DALLOC(rt->onorm, B * d * 4);
    DALLOC(rt->logits, B * (size_t)c->n_vocab * 4);
    DALLOC(rt->part, attn_tokens * part_per_tok);
    DALLOC(rt->d_top_ids, B * EIC_TOPK_MAX * 4);
    DALLOC(rt->d_top_vals, B * EIC_TOPK_MAX * 4);
    if (local_rope) {
        DALLOC(rt->rope_cos_l, B * half * 4);
        DALLOC(rt->rope_sin_l, B * half * 4);
    }
    if (c->has_post_norms || e_ple) DALLOC(rt->post, B * d * 4);
    if (e_ple) {
        DALLOC(rt->ple, B * ple_all * 4);
        DALLOC(rt->ple_in, B * ple_all * 4);
        DALLOC(rt->ple_gate, B * e_ple * 4);
        DALLOC(rt->d_ple_rows, B * (ple_rb ? ple_rb : 1));
        DALLOC(rt->d_iota, B * 4);
    }
    if (state_floats) {
        DALLOC(rt->d_state, (size_t)p->n_slots * state_floats * 4);
        if (n_snap) DALLOC(rt->d_snap, (size_t)p->n_slots * n_snap * state_floats * 4);
        DALLOC(rt->rec_a, B * rec_a * 4);
        DALLOC(rt->rec_b, B * rec_b * 4);
    }
    if (c->has_attn_gate) {
        DALLOC(rt->qg, 2 * B * qd * 4);
        DALLOC(rt->agate, B * qd * 4);
    }
#undef DALLOC
    if ((st = eic_check(cudaMallocHost((void **)&rt->h_batch, EIC_BATCH_ARRAYS * B * 4), "cudaMallocHost")) != EI_OK) goto fail;
    if (e_ple) {
        if ((st = eic_check(cudaMallocHost((void **)&rt->h_ple_rows, B * (ple_rb ? ple_rb : 1)), "cudaMallocHost")) != EI_OK)
            goto fail;
        for (size_t i = 0; i < B; i++) rt->h_batch[i] = (int32_t)i;   /* staged through h_batch, before its first use */
        if ((st = eic_check(cudaMemcpy(rt->d_iota, rt->h_batch, B * 4, cudaMemcpyHostToDevice), "iota upload")) != EI_OK)
            goto fail;
        rt->ple_row_bytes = (int64_t)ple_rb;
    }
    if ((st = eic_check(cudaMemset(rt->kv.k, 0, kv_elems * 2), "cudaMemset")) != EI_OK) goto fail;
    if ((st = eic_check(cudaMemset(rt->kv.v, 0, kv_elems * 2), "cudaMemset")) != EI_OK) goto fail;
    if ((st = eic_check(cudaMemset(rt->d_cell_pos, 0xff, (size_t)p->n_slots * p->n_ctx * 4), "cudaMemset")) != EI_OK)
        goto fail;
    if (state_floats &&   /* every slot starts from a zero state */
        (st = eic_check(cudaMemset(rt->d_state, 0, (size_t)p->n_slots * state_floats * 4), "cudaMemset")) != EI_OK)
        goto fail;
    {   /* each storing layer's block, in layer order in its arena; a KV-shared layer reads its source's */
        size_t off = 0, off_l = 0;
        for (int l = 0; l < c->n_layer; l++) {
            if (!ei_layer_stores_kv(c, l)) continue;
            const int ring = n_local && ei_layer_is_local(c, l);
            eic_kv *v = &rt->kv_view[l];
            v->n_layer = 1;
            v->n_head_kv = c->n_head_kv;
            v->n_ctx = ring ? local_cells : p->n_ctx;
            v->hd = ei_layer_head_dim(c, l);
            v->slot_stride = (int64_t)v->n_head_kv * v->n_ctx * v->hd;
            size_t *at = ring ? &off_l : &off;
            v->k = (ring ? rt->kv_l.k : rt->kv.k) + *at;
            v->v = (ring ? rt->kv_l.v : rt->kv.v) + *at;
            *at += (size_t)p->n_slots * v->slot_stride;
        }
        for (int l = 0; l < c->n_layer; l++)
            if (!ei_layer_is_recurrent(c, l) && !ei_layer_stores_kv(c, l)) rt->kv_view[l] = rt->kv_view[ei_layer_kv_source(c, l)];
    }
    if (n_local) {
        if ((st = eic_check(cudaMemset(rt->kv_l.k, 0, kv_elems_l * 2), "cudaMemset")) != EI_OK) goto fail;
        if ((st = eic_check(cudaMemset(rt->kv_l.v, 0, kv_elems_l * 2), "cudaMemset")) != EI_OK) goto fail;
        if ((st = eic_check(cudaMemset(rt->d_cell_pos_l, 0xff, (size_t)p->n_slots * local_cells * 4), "cudaMemset")) !=
            EI_OK)
            goto fail;
    }

    /* ---- upload the weights, one tensor at a time ---- */
    {
        uint8_t *at = (uint8_t *)rt->w_arena;
        for (int32_t i = 0; i < n_tensors; i++) {
            const ei_cuda_tensor *t = &tensors[i];
            ei_weight *w = ei_weight_slot(&rt->globals, rt->layers, c->n_layer, t->layer, t->role);
            if (!w) {
                st = eic_fail(EI_ERR_INVALID_ARG, "tensor %d: role %d at layer %d is not a known role", i, t->role, t->layer);
                goto fail;
            }
            if (is_ple_table(t)) {   /* a host pointer, for the layout check and the per-step gather only */
                rt->ple_host = (const uint8_t *)t->data;
                rt->ple_type = t->type;
                w->data = t->data;
                w->type = t->type;
                w->ne0 = t->ne0;
                w->ne1 = t->ne1;
                continue;
            }
            const size_t b = (size_t)dev_bytes(t);
            if (ei_role_is_vector(t->role)) {   /* small: converted to f32 on the host */
                const int64_t n = t->ne0 * t->ne1;
                float *tmp = (float *)malloc((size_t)n * 4);
                if (!tmp) {
                    st = eic_fail(EI_ERR_OUT_OF_MEMORY, "out of host memory");
                    goto fail;
                }
                const uint16_t *h = (const uint16_t *)t->data;
                for (int64_t k = 0; k < n; k++) {
                    if (t->type == EI_TYPE_F32) tmp[k] = ((const float *)t->data)[k];
                    else if (t->type == EI_TYPE_F16) tmp[k] = host_h2f(h[k]);
                    else {
                        const uint32_t bits = (uint32_t)h[k] << 16;
                        memcpy(&tmp[k], &bits, 4);
                    }
                }
                st = eic_check(cudaMemcpy(at, tmp, b, cudaMemcpyHostToDevice), "upload");
                if (t->role == EI_T_LAYER_OUT_SCALE && t->layer >= 0 && t->layer < c->n_layer) rt->out_scale[t->layer] = tmp[0];
                free(tmp);
                w->type = EI_TYPE_F32;
            } else {
                st = eic_check(cudaMemcpy(at, t->data, b, cudaMemcpyHostToDevice), "upload");
                w->type = t->type;
            }
            if (st != EI_OK) goto fail;
            if (p->drop_host_pages) drop_pages(t->data, b);
            w->data = at;
            w->ne0 = t->ne0;
            w->ne1 = t->ne1;
            at += al256(b);
        }
    }
    if ((st = ei_layout_check(c, &rt->globals, rt->layers, msg, sizeof msg)) != EI_OK) {
        eic_fail(st, "%s", msg);
        goto fail;
    }
    /* The memsets and uploads above ran on the legacy default stream: cudaMemset is
     * asynchronous and a pageable cudaMemcpy may return before its DMA lands, while
     * rt->stream is cudaStreamNonBlocking (no implicit ordering with stream 0). Wait
     * for all of it before the first forward reads the weights or the KV arena. */
    if ((st = eic_check(cudaDeviceSynchronize(), "weight upload")) != EI_OK) goto fail;
    *out = rt;
    return EI_OK;
fail:
    ei_cuda_runtime_free(rt);
    return st;
}

extern "C" ei_status ei_cuda_runtime_sizes(const ei_cuda_runtime *rt, ei_cuda_sizes *out) {
    if (!rt || !out) return eic_fail(EI_ERR_INVALID_ARG, "runtime_sizes: null argument");
    *out = rt->sizes;
    return EI_OK;
}

/* The current device is per host thread, and the engine calls from its scheduler
 * thread, not the one that created the runtime: select ours on every entry. */
static ei_status use_device(const ei_cuda_runtime *rt) {
    return eic_check(cudaSetDevice(rt->p.device), "cudaSetDevice");
}

/* ---------------------------------------------------------------- KV bookkeeping */
static ei_status sync_slot(ei_cuda_runtime *rt, int32_t slot) {
    const size_t off = (size_t)slot * rt->p.n_ctx;
    /* On rt->stream, not with cudaMemcpy: that runs on the legacy default stream, which
     * a cudaStreamNonBlocking stream does not wait for, and from pageable memory it may
     * return before the DMA lands, so the next step's rope_tables (which writes the new
     * cells' positions) could be overwritten by this stale copy. Synchronize so the
     * host can edit h_cell_pos again right away. */
    ei_status st = eic_check(cudaMemcpyAsync(rt->d_cell_pos + off, rt->h_cell_pos + off, (size_t)rt->p.n_ctx * 4,
                                             cudaMemcpyHostToDevice, rt->stream), "cell_pos upload");
    if (st != EI_OK) return st;
    if (rt->local_cells) {
        const size_t lo = (size_t)slot * rt->local_cells;
        st = eic_check(cudaMemcpyAsync(rt->d_cell_pos_l + lo, rt->h_cell_pos_l + lo, (size_t)rt->local_cells * 4,
                                       cudaMemcpyHostToDevice, rt->stream), "local cell_pos upload");
        if (st != EI_OK) return st;
    }
    return eic_check(cudaStreamSynchronize(rt->stream), "cell_pos upload");
}

/* ---------------------------------------------------------------- recurrent states (state.c's rules) */
static float *state_live(const ei_cuda_runtime *rt, int slot) { return rt->d_state + (size_t)slot * rt->state_floats; }
static float *state_kept(const ei_cuda_runtime *rt, int slot, int k) {
    return rt->d_snap + ((size_t)slot * rt->n_snap + k) * rt->state_floats;
}

/* The kept copy of slot after n positions, -1 when none. */
static int find_kept(const ei_cuda_runtime *rt, int slot, int32_t n) {
    const int32_t *tags = rt->snap_n + (size_t)slot * rt->n_snap;
    for (int k = 0; k < rt->n_snap; k++)
        if (tags[k] == n) return k;
    return -1;
}

/* Where a copy after n positions goes: its own, a free one, else the one after the fewest
 * positions when that is fewer than n (the slot keeps the n_snap latest); -1: none. */
static int place_kept(ei_cuda_runtime *rt, int slot, int32_t n) {
    int32_t *tags = rt->snap_n + (size_t)slot * rt->n_snap;
    int k = find_kept(rt, slot, n), oldest = -1;
    for (int j = 0; k < 0 && j < rt->n_snap; j++) {
        if (tags[j] < 0) k = j;
        else if (oldest < 0 || tags[j] < tags[oldest]) oldest = j;
    }
    if (k < 0 && oldest >= 0 && tags[oldest] < n) k = oldest;
    if (k >= 0) tags[k] = n;
    return k;
}

/* Each slot's rows continue its live state in position order (EI_ERR_STATE otherwise). */
static ei_status state_check(const ei_cuda_runtime *rt, int32_t n_tokens, const int32_t *slots, const int32_t *pos) {
    for (int32_t i = 0; rt->d_state && i < n_tokens; i++) {
        int32_t seen = rt->state_seen[slots[i]];
        for (int32_t j = i - 1; j >= 0; j--)
            if (slots[j] == slots[i]) {
                seen = pos[j] + 1;
                break;
            }
        if (pos[i] != seen)
            return eic_fail(EI_ERR_STATE, seen < 0 ? "slot %d: its recurrent state was forgotten and not restored "
                                                     "(batch row %d at position %d)"
                                                   : "slot %d: batch row %d at position %d does not continue its "
                                                     "recurrent state (%d positions seen)",
                            slots[i], i, pos[i], seen);
    }
    return EI_OK;
}

/* forget_from's part for the states, queued on rt->stream (the caller synchronizes). */
static ei_status state_forget(ei_cuda_runtime *rt, int slot, int32_t pos) {
    if (!rt->d_state) return EI_OK;
    int32_t *tags = rt->snap_n + (size_t)slot * rt->n_snap;
    for (int k = 0; k < rt->n_snap; k++)
        if (tags[k] > pos) tags[k] = -1;
    if (pos == 0) {   /* the slot starts over from a zero state */
        rt->state_seen[slot] = 0;
        return eic_check(cudaMemsetAsync(state_live(rt, slot), 0, (size_t)rt->state_floats * 4, rt->stream),
                         "state reset");
    }
    if (rt->state_seen[slot] > pos) rt->state_seen[slot] = -1;   /* cannot be rewound: restore_state brings a copy back */
    return EI_OK;
}

extern "C" ei_status ei_cuda_restore_state(ei_cuda_runtime *rt, int32_t slot, int32_t n) {
    if (!rt) return eic_fail(EI_ERR_INVALID_ARG, "null runtime");
    if (slot < 0 || slot >= rt->p.n_slots) return eic_fail(EI_ERR_RANGE, "slot %d out of [0, %d)", slot, rt->p.n_slots);
    if (!rt->d_state || rt->state_seen[slot] == n) return EI_OK;
    ei_status st = use_device(rt);
    if (st != EI_OK) return st;
    if (n == 0) {
        if ((st = state_forget(rt, slot, 0)) != EI_OK) return st;
        return eic_check(cudaStreamSynchronize(rt->stream), "state reset");
    }
    const int k = n > 0 ? find_kept(rt, slot, n) : -1;
    if (k < 0) return eic_fail(EI_ERR_STATE, "slot %d kept no recurrent state after %d positions", slot, n);
    st = eic_check(cudaMemcpyAsync(state_live(rt, slot), state_kept(rt, slot, k), (size_t)rt->state_floats * 4,
                                   cudaMemcpyDeviceToDevice, rt->stream), "state restore");
    if (st == EI_OK) st = eic_check(cudaStreamSynchronize(rt->stream), "state restore");
    if (st == EI_OK) rt->state_seen[slot] = n;
    return st;
}

extern "C" ei_status ei_cuda_drop_state(ei_cuda_runtime *rt, int32_t slot, int32_t n) {
    if (!rt) return eic_fail(EI_ERR_INVALID_ARG, "null runtime");
    if (slot < 0 || slot >= rt->p.n_slots) return eic_fail(EI_ERR_RANGE, "slot %d out of [0, %d)", slot, rt->p.n_slots);
    if (!rt->d_state) return EI_OK;
    const int k = find_kept(rt, slot, n);
    if (k >= 0) rt->snap_n[(size_t)slot * rt->n_snap + k] = -1;
    return EI_OK;
}

extern "C" ei_status ei_cuda_forget_from(ei_cuda_runtime *rt, int32_t slot, int32_t pos) {
    if (!rt) return eic_fail(EI_ERR_INVALID_ARG, "null runtime");
    if (slot < 0 || slot >= rt->p.n_slots) return eic_fail(EI_ERR_RANGE, "slot %d out of [0, %d)", slot, rt->p.n_slots);
    if (pos < 0) return eic_fail(EI_ERR_RANGE, "position %d is negative", pos);
    int32_t *cp = rt->h_cell_pos + (size_t)slot * rt->p.n_ctx;
    int32_t used = 0;
    for (int32_t c = 0; c < rt->h_n_used[slot]; c++) {
        if (cp[c] >= pos) cp[c] = -1;
        if (cp[c] >= 0) used = c + 1;
    }
    rt->h_n_used[slot] = used;
    if (rt->local_cells) {
        int32_t *lp = rt->h_cell_pos_l + (size_t)slot * rt->local_cells;
        used = 0;
        for (int32_t c = 0; c < rt->h_n_used_l[slot]; c++) {
            if (lp[c] >= pos) lp[c] = -1;
            if (lp[c] >= 0) used = c + 1;
        }
        rt->h_n_used_l[slot] = used;
    }
    ei_status st = use_device(rt);
    if (st == EI_OK) st = state_forget(rt, slot, pos);   /* queued before sync_slot's wait */
    return st != EI_OK ? st : sync_slot(rt, slot);
}

extern "C" ei_status ei_cuda_clear_slot(ei_cuda_runtime *rt, int32_t slot) { return ei_cuda_forget_from(rt, slot, 0); }

extern "C" ei_status ei_cuda_copy_prefix(ei_cuda_runtime *rt, int32_t src, int32_t dst, int32_t n) {
    if (!rt) return eic_fail(EI_ERR_INVALID_ARG, "null runtime");
    const int32_t ns = rt->p.n_slots, nc = rt->p.n_ctx, L = rt->local_cells;
    if (src < 0 || src >= ns || dst < 0 || dst >= ns)
        return eic_fail(EI_ERR_RANGE, "slots %d, %d out of [0, %d)", src, dst, ns);
    if (n < 0 || n > nc) return eic_fail(EI_ERR_RANGE, "%d positions out of [0, %d]", n, nc);
    const int32_t *sp = rt->h_cell_pos + (size_t)src * nc;
    for (int32_t c = 0; c < n; c++)   /* cell c must hold position c: the prefix never wrapped */
        if (c >= rt->h_n_used[src] || sp[c] != c)
            return eic_fail(EI_ERR_STATE, "slot %d does not hold position %d in cell %d", src, c, c);
    const int32_t first = ei_window_first(&rt->cfg, n);
    if (L) {   /* the sliding layers' ring still holds the window the next token sees */
        const int32_t *lp = rt->h_cell_pos_l + (size_t)src * L;
        for (int32_t q = first; q < n; q++)
            if (lp[q % L] != q) return eic_fail(EI_ERR_STATE, "slot %d: its sliding-window ring lost position %d", src, q);
    }
    if (src == dst) {
        const ei_status st = ei_cuda_forget_from(rt, dst, n);
        return st == EI_OK ? ei_cuda_restore_state(rt, dst, n) : st;
    }
    /* the recurrent state after n positions (state.c's ei_state_copy): a kept copy, or the live
     * state when it has seen n; refused before anything of dst changes */
    const float *from = NULL;
    if (rt->d_state && n > 0) {
        const int k = find_kept(rt, src, n);
        from = k >= 0 ? state_kept(rt, src, k) : rt->state_seen[src] == n ? state_live(rt, src) : NULL;
        if (!from) return eic_fail(EI_ERR_STATE, "slot %d kept no recurrent state after %d positions", src, n);
    }
    ei_status st = use_device(rt);
    if (st == EI_OK) st = state_forget(rt, dst, 0);   /* dst starts over: tags cleared, live state zero */
    if (st == EI_OK && from) {   /* ei_state_put: the live state, and a kept copy for a rollback to n */
        const size_t bytes = (size_t)rt->state_floats * 4;
        st = eic_check(cudaMemcpyAsync(state_live(rt, dst), from, bytes, cudaMemcpyDeviceToDevice, rt->stream),
                       "state copy");
        rt->state_seen[dst] = n;
        const int k = place_kept(rt, dst, n);
        if (st == EI_OK && k >= 0)
            st = eic_check(cudaMemcpyAsync(state_kept(rt, dst, k), from, bytes, cudaMemcpyDeviceToDevice, rt->stream),
                           "state copy");
    }
    /* each storing layer's cells, through its one-layer view: [0, n) of the full ring, the whole
     * slot of the local ring (its cells outside [first, n) are marked empty below) */
    for (int l = 0; st == EI_OK && l < rt->cfg.n_layer; l++) {
        if (!ei_layer_stores_kv(&rt->cfg, l)) continue;
        const eic_kv *v = &rt->kv_view[l];
        const int ring = L && ei_layer_is_local(&rt->cfg, l);
        const int64_t head = (int64_t)v->n_ctx * v->hd;
        const size_t bytes = (ring ? (size_t)v->slot_stride : (size_t)n * v->hd) * sizeof(uint16_t);
        for (int h = 0; st == EI_OK && h < (ring ? 1 : v->n_head_kv) && bytes; h++) {
            const int64_t s_off = src * v->slot_stride + h * head, d_off = dst * v->slot_stride + h * head;
            st = eic_check(cudaMemcpyAsync(v->k + d_off, v->k + s_off, bytes, cudaMemcpyDeviceToDevice, rt->stream),
                           "KV copy");
            if (st == EI_OK)
                st = eic_check(cudaMemcpyAsync(v->v + d_off, v->v + s_off, bytes, cudaMemcpyDeviceToDevice,
                                               rt->stream), "KV copy");
        }
    }
    if (st != EI_OK) {   /* dst half-copied: it holds nothing */
        ei_cuda_forget_from(rt, dst, 0);
        return st;
    }
    int32_t *dp = rt->h_cell_pos + (size_t)dst * nc;
    for (int32_t c = 0; c < rt->h_n_used[dst] || c < n; c++) dp[c] = c < n ? c : -1;
    rt->h_n_used[dst] = n;
    if (L) {
        int32_t *lp = rt->h_cell_pos_l + (size_t)dst * L;
        for (int32_t c = 0; c < L; c++) lp[c] = -1;
        for (int32_t q = first; q < n; q++) lp[q % L] = q;
        rt->h_n_used_l[dst] = n < L ? n : L;
    }
    return sync_slot(rt, dst);   /* uploads dst's cell positions once the copies are queued, and waits */
}

/* ---------------------------------------------------------------- LoRA adapters */
static int lora_role_index(int role) {
    for (int k = 0; k < N_LORA_ROLES; k++)
        if (LORA_ROLES[k] == role) return k;
    return -1;
}

/* The adapter's pair for role LORA_ROLES[k] of layer (-1: the head), or NULL. */
static const eic_lora_pair *lora_pair(const ei_cuda_lora *a, int layer, int k) {
    const eic_lora_pair *p = &a->pairs[(size_t)(layer < 0 ? a->n_layer : layer) * N_LORA_ROLES + k];
    return p->a ? p : NULL;
}

extern "C" ei_status ei_cuda_lora_create(ei_cuda_runtime *rt, ei_cuda_lora **out) {
    if (!rt || !out) return eic_fail(EI_ERR_INVALID_ARG, "cuda_lora_create: null argument");
    *out = NULL;
    ei_cuda_lora *a = (ei_cuda_lora *)calloc(1, sizeof *a);
    if (a) a->pairs = (eic_lora_pair *)calloc((size_t)(rt->cfg.n_layer + 1) * N_LORA_ROLES, sizeof(eic_lora_pair));
    if (!a || !a->pairs) {
        free(a);
        return eic_fail(EI_ERR_OUT_OF_MEMORY, "cuda_lora_create: out of host memory");
    }
    a->rt = rt;
    a->device = rt->p.device;
    a->n_layer = rt->cfg.n_layer;
    *out = a;
    return EI_OK;
}

/* Needs no runtime: an adapter may outlive its runtime's handle (garbage collection order). */
extern "C" void ei_cuda_lora_free(ei_cuda_lora *a) {
    if (!a) return;
    if (cudaSetDevice(a->device) != cudaSuccess) cudaGetLastError();
    for (size_t i = 0; i < (size_t)(a->n_layer + 1) * N_LORA_ROLES; i++) {
        if (a->pairs[i].a) cudaFree(a->pairs[i].a);
        if (a->pairs[i].b) cudaFree(a->pairs[i].b);
    }
    free(a->pairs);
    free(a);
}

extern "C" size_t ei_cuda_lora_bytes(const ei_cuda_lora *a) { return a ? a->bytes : 0; }

extern "C" ei_status ei_cuda_lora_set(ei_cuda_lora *a, int layer, int role, int32_t rank, const float *A,
                                      const float *B) {
    if (!a || !A || !B) return eic_fail(EI_ERR_INVALID_ARG, "cuda_lora_set: null argument");
    ei_cuda_runtime *rt = (ei_cuda_runtime *)a->rt;
    const ei_weight *w = ei_weight_slot(&rt->globals, rt->layers, rt->cfg.n_layer, layer, role);
    if (!w || !w->data)
        return eic_fail(EI_ERR_INVALID_ARG, "cuda_lora_set: the model has no tensor role %d at layer %d", role, layer);
    if (role == EI_T_TOKEN_EMBD)
        return eic_fail(EI_ERR_UNSUPPORTED, "cuda_lora_set: the token embedding is a lookup, not a matmul");
    const int k = lora_role_index(role);
    if (k < 0)
        return eic_fail(EI_ERR_UNSUPPORTED, "cuda_lora_set: the CUDA runtime adapts Q, K, V, O, gate, up, down and "
                                            "the output head, not role %d", role);
    if (rank < 1 || rank > 4096) return eic_fail(EI_ERR_INVALID_ARG, "cuda_lora_set: rank %d outside [1, 4096]", rank);
    eic_lora_pair *p = &a->pairs[(size_t)(layer < 0 ? a->n_layer : layer) * N_LORA_ROLES + k];
    if (p->a) return eic_fail(EI_ERR_INVALID_ARG, "cuda_lora_set: role %d at layer %d set twice", role, layer);
    ei_status st = use_device(rt);
    if (st != EI_OK) return st;
    const size_t na = (size_t)rank * w->ne0 * sizeof(float), nb = (size_t)w->ne1 * rank * sizeof(float);
    eic_lora_pair q = {NULL, NULL, rank, w->ne0, w->ne1};
    st = eic_check(cudaMalloc((void **)&q.a, na), "cudaMalloc lora A");
    if (st == EI_OK) st = eic_check(cudaMalloc((void **)&q.b, nb), "cudaMalloc lora B");
    /* on rt->stream and waited for: the caller's arrays may go once this returns */
    if (st == EI_OK) st = eic_check(cudaMemcpyAsync(q.a, A, na, cudaMemcpyHostToDevice, rt->stream), "lora upload");
    if (st == EI_OK) st = eic_check(cudaMemcpyAsync(q.b, B, nb, cudaMemcpyHostToDevice, rt->stream), "lora upload");
    if (st == EI_OK) st = eic_check(cudaStreamSynchronize(rt->stream), "lora upload");
    if (st != EI_OK) {
        if (q.a) cudaFree(q.a);
        if (q.b) cudaFree(q.b);
        return st;
    }
    *p = q;
    a->bytes += na + nb;
    if (rank > a->max_rank) a->max_rank = rank;
    return EI_OK;
}

extern "C" ei_status ei_cuda_runtime_set_slot_loras(ei_cuda_runtime *rt, int slot, int n, ei_cuda_lora *const *loras,
                                                    const float *scales) {
    if (!rt) return eic_fail(EI_ERR_INVALID_ARG, "set_slot_loras: null runtime");
    if (slot < 0 || slot >= rt->p.n_slots) return eic_fail(EI_ERR_RANGE, "slot %d outside [0, %d)", slot, rt->p.n_slots);
    if (n < 0 || n > EI_MAX_SLOT_LORAS)
        return eic_fail(EI_ERR_RANGE, "%d adapters on one slot (at most %d)", n, (int)EI_MAX_SLOT_LORAS);
    if (n && (!loras || !scales)) return eic_fail(EI_ERR_INVALID_ARG, "set_slot_loras: null argument");
    if (n == 0 && !rt->slot_lora) return EI_OK;
    int32_t rank = rt->lora_rank;
    for (int i = 0; i < n; i++) {
        if (!loras[i] || loras[i]->rt != rt)
            return eic_fail(EI_ERR_INVALID_ARG, "set_slot_loras: adapter %d is not for this runtime", i);
        if (loras[i]->max_rank > rank) rank = loras[i]->max_rank;
    }
    if (!rt->slot_lora && !(rt->slot_lora = (eic_slot_loras *)calloc((size_t)rt->p.n_slots, sizeof(eic_slot_loras))))
        return eic_fail(EI_ERR_OUT_OF_MEMORY, "set_slot_loras: out of host memory");
    if (rank > rt->lora_rank) {   /* A x of a group: max_batch rows of the largest rank attached */
        ei_status st = use_device(rt);
        float *t = NULL;
        if (st == EI_OK)
            st = eic_check(cudaMalloc((void **)&t, (size_t)rt->p.max_batch * rank * sizeof(float)), "cudaMalloc lora");
        if (st != EI_OK) return st;
        if (rt->d_lora_t) cudaFree(rt->d_lora_t);
        rt->d_lora_t = t;
        rt->lora_rank = rank;
    }
    eic_slot_loras *s = &rt->slot_lora[slot];
    s->n = n;
    for (int i = 0; i < n; i++) {
        s->lora[i] = loras[i];
        s->scale[i] = scales[i];
    }
    return EI_OK;
}

/* Room for `need` groups of a step. */
static ei_status lora_reserve(ei_cuda_runtime *rt, int32_t need) {
    if (need <= rt->lora_cap) return EI_OK;
    const int32_t cap = need > 2 * rt->lora_cap ? (need > 4 ? need : 4) : 2 * rt->lora_cap;
    const size_t per = 2 * (size_t)rt->p.max_batch;
    const ei_cuda_lora **g = (const ei_cuda_lora **)realloc((void *)rt->lora_group, (size_t)cap * sizeof *g);
    if (g) rt->lora_group = g;
    int32_t *cnt = g ? (int32_t *)realloc(rt->lora_count, (size_t)cap * 2 * sizeof(int32_t)) : NULL;
    if (cnt) rt->lora_count = cnt;
    int32_t *hr = cnt ? (int32_t *)realloc(rt->h_lora_rows, (size_t)cap * per * sizeof(int32_t)) : NULL;
    if (hr) rt->h_lora_rows = hr;
    float *hs = hr ? (float *)realloc(rt->h_lora_scale, (size_t)cap * per * sizeof(float)) : NULL;
    if (hs) rt->h_lora_scale = hs;
    if (!hs) return eic_fail(EI_ERR_OUT_OF_MEMORY, "lora: out of host memory");
    int32_t *dr = NULL;
    float *ds = NULL;
    ei_status st = eic_check(cudaMalloc((void **)&dr, (size_t)cap * per * sizeof(int32_t)), "cudaMalloc lora rows");
    if (st == EI_OK) st = eic_check(cudaMalloc((void **)&ds, (size_t)cap * per * sizeof(float)), "cudaMalloc lora rows");
    if (st != EI_OK) {
        if (dr) cudaFree(dr);
        return st;
    }
    if (rt->d_lora_rows) cudaFree(rt->d_lora_rows);
    if (rt->d_lora_scale) cudaFree(rt->d_lora_scale);
    rt->d_lora_rows = dr;
    rt->d_lora_scale = ds;
    rt->lora_cap = cap;
    return EI_OK;
}

/* The step's groups: every adapter of the batch's slots, with the token rows and the head's output
 * rows of the slots that use it, each row's scale the sum of that adapter's scales on its slot;
 * uploaded on rt->stream. No group: the step runs as without adapters (graphs included). */
static ei_status lora_plan(ei_cuda_runtime *rt, int32_t T, const int32_t *slots, int32_t n_out,
                           const int32_t *out_rows) {
    rt->n_lora_groups = 0;
    if (!rt->slot_lora) return EI_OK;
    int32_t ng = 0;
    for (int32_t t = 0; t < T; t++) {
        const eic_slot_loras *s = &rt->slot_lora[slots[t]];
        for (int i = 0; i < s->n; i++) {
            int32_t g = 0;
            while (g < ng && rt->lora_group[g] != s->lora[i]) g++;
            if (g < ng) continue;
            const ei_status st = lora_reserve(rt, ng + 1);
            if (st != EI_OK) return st;
            rt->lora_group[ng++] = s->lora[i];
        }
    }
    if (!ng) return EI_OK;
    const size_t B = (size_t)rt->p.max_batch;
    for (int32_t g = 0; g < ng; g++)
        for (int h = 0; h < 2; h++) {
            int32_t *rows = rt->h_lora_rows + (2 * (size_t)g + h) * B;
            float *sc = rt->h_lora_scale + (2 * (size_t)g + h) * B;
            int32_t n = 0;
            for (int32_t r = 0; r < (h ? n_out : T); r++) {
                const eic_slot_loras *s = &rt->slot_lora[slots[h ? out_rows[r] : r]];
                float scale = 0.0f;
                int uses = 0;
                for (int i = 0; i < s->n; i++)
                    if (s->lora[i] == rt->lora_group[g]) scale += s->scale[i], uses = 1;
                if (uses) rows[n] = r, sc[n++] = scale;
            }
            rt->lora_count[2 * g + h] = n;
        }
    const size_t n = 2 * (size_t)ng * B;
    ei_status st = eic_check(cudaMemcpyAsync(rt->d_lora_rows, rt->h_lora_rows, n * sizeof(int32_t),
                                             cudaMemcpyHostToDevice, rt->stream), "lora rows upload");
    if (st == EI_OK)
        st = eic_check(cudaMemcpyAsync(rt->d_lora_scale, rt->h_lora_scale, n * sizeof(float), cudaMemcpyHostToDevice,
                                       rt->stream), "lora rows upload");
    if (st == EI_OK) rt->n_lora_groups = ng;
    return st;
}

/* Does a group of this step adapt role LORA_ROLES[k] of layer? */
static int lora_touches(const ei_cuda_runtime *rt, int layer, int k) {
    for (int32_t g = 0; g < rt->n_lora_groups; g++)
        if (lora_pair(rt->lora_group[g], layer, k)) return 1;
    return 0;
}

/* After the matmul of role LORA_ROLES[k] of layer (-1: the head, on the output rows) from x into y:
 * y[row] += scale * B (A x[row]) for every group's rows. */
static cudaError_t lora_apply(ei_cuda_runtime *rt, int layer, int k, const float *x, int64_t ldx, float *y,
                              int64_t ldy) {
    const int h = layer < 0;
    const size_t B = (size_t)rt->p.max_batch;
    for (int32_t g = 0; g < rt->n_lora_groups; g++) {
        const eic_lora_pair *p = lora_pair(rt->lora_group[g], layer, k);
        const int32_t n = rt->lora_count[2 * g + h];
        if (!p || !n) continue;
        const int32_t *rows = rt->d_lora_rows + (2 * (size_t)g + h) * B;
        const float *sc = rt->d_lora_scale + (2 * (size_t)g + h) * B;
        cudaError_t e = eic_lora_down(rt->stream, p->a, p->rank, p->ne0, x, ldx, rows, n, rt->d_lora_t);
        if (e != cudaSuccess) return e;
        if ((e = eic_lora_up(rt->stream, p->b, p->ne1, p->rank, rt->d_lora_t, rows, sc, n, y, ldy)) != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

/* ---------------------------------------------------------------- forward */
#define LCK(call)                                  \
    do {                                           \
        cudaError_t e_ = (call);                   \
        if (e_ != cudaSuccess) return e_;          \
    } while (0)

/* The matmuls of parts (n <= EIC_MM_MAX_PARTS) on rmsnorm(x) * norm: one launch per
 * distinct weight type, the rows of same-typed weights concatenated. */
static cudaError_t matmul_by_type(cudaStream_t s, const eic_mm_part *parts, const int *types, int n, int64_t n_cols,
                                  const float *x, int64_t n_tok, const float *norm, float eps) {
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i; j++) first &= types[j] != types[i];
        if (!first) continue;   /* launched with an earlier part of its type */
        eic_mm_part group[EIC_MM_MAX_PARTS];
        int m = 0;
        for (int j = i; j < n; j++)
            if (types[j] == types[i]) group[m++] = parts[j];
        LCK(eic_matmul_multi(s, types[i], group, m, n_cols, x, n_cols, n_tok, norm, eps, 0));
    }
    return cudaSuccess;
}

/* A mixing block's output projection (W in -> n_embd) joining the residual: added to x, or
 * through the post-norm (Gemma 3) from rt->post. */
static cudaError_t block_out(ei_cuda_runtime *rt, int l, const ei_weight *w, const float *in, int64_t n_in, int32_t T,
                             int lora_k) {
    const ei_model_config *c = &rt->cfg;
    const int64_t d = c->n_embd;
    float *y = c->has_post_norms ? rt->post : rt->x;
    LCK(eic_matmul(rt->stream, w->type, w->data, d, n_in, in, n_in, T, NULL, !c->has_post_norms, y, d));
    if (lora_k >= 0 && rt->n_lora_groups) LCK(lora_apply(rt, l, lora_k, in, n_in, y, d));
    if (c->has_post_norms)
        LCK(eic_rmsnorm_add(rt->stream, rt->post, (const float *)rt->layers[l].attn_post_norm.data, T, d, c->rms_eps,
                            rt->x));
    return cudaSuccess;
}

/* Layer l's recurrent state on the device, for the step's rows. */
static eic_rstate layer_state(const ei_cuda_runtime *rt, int l, int64_t extra_off) {
    eic_rstate rs = {rt->d_state, rt->d_snap, rt->state_floats, rt->state_off[l] + extra_off, rt->n_snap,
                     batch_arr(rt, rt->d_batch, 1), batch_arr(rt, rt->d_batch, 8)};
    return rs;
}

/* LFM2's gated short convolution: in_proj (with attn_norm) -> B, C, x; C * conv(B * x); out_proj. */
static cudaError_t shortconv_block(ei_cuda_runtime *rt, int l, int32_t T) {
    const ei_model_config *c = &rt->cfg;
    const ei_layer *L = &rt->layers[l];
    const int64_t d = c->n_embd;
    const eic_mm_part in = {L->shortconv_in.data, NULL, rt->rec_a, 3 * d, 3 * d};
    LCK(eic_matmul_multi(rt->stream, L->shortconv_in.type, &in, 1, d, rt->x, d, T, (const float *)L->attn_norm.data,
                         c->rms_eps, 0));
    const eic_rstate rs = layer_state(rt, l, 0);
    LCK(eic_conv1d_state(rt->stream, EIC_CONV_SHORTCONV, rt->rec_a, (const float *)L->shortconv_conv.data,
                         c->conv_kernel, d, T, &rs, rt->rec_b));
    return block_out(rt, l, &L->shortconv_out, rt->rec_b, d, T, -1);
}

/* Qwen3.5's Gated DeltaNet: qkv, z, alpha, beta (with attn_norm); silu(conv(qkv)); the gated
 * delta rule; gated RMSNorm by z; out_proj. */
static cudaError_t deltanet_block(ei_cuda_runtime *rt, int l, int32_t T) {
    const ei_model_config *c = &rt->cfg;
    const ei_layer *L = &rt->layers[l];
    const size_t B = (size_t)rt->p.max_batch;
    const int64_t d = c->n_embd, cd = ei_deltanet_conv_dim(c), inner = ei_deltanet_inner(c), nv = c->ssm_v_heads;
    float *qkv = rt->rec_a, *z = qkv + B * cd, *alpha = z + B * inner, *beta = alpha + B * nv;
    float *y = rt->rec_b, *o = y + B * cd;
    const float *norm = (const float *)L->attn_norm.data;
    const eic_mm_part parts[3] = {{L->ssm_qkv.data, NULL, qkv, cd, cd}, {L->ssm_gate.data, NULL, z, inner, inner},
                                  {L->ssm_alpha.data, NULL, alpha, nv, nv}};
    const int types[3] = {L->ssm_qkv.type, L->ssm_gate.type, L->ssm_alpha.type};
    LCK(matmul_by_type(rt->stream, parts, types, 3, d, rt->x, T, norm, c->rms_eps));
    const eic_mm_part bp = {L->ssm_beta.data, NULL, beta, nv, nv};
    LCK(eic_matmul_multi(rt->stream, L->ssm_beta.type, &bp, 1, d, rt->x, d, T, norm, c->rms_eps, 0));
    const eic_rstate conv = layer_state(rt, l, 0);
    LCK(eic_conv1d_state(rt->stream, EIC_CONV_SILU, qkv, (const float *)L->ssm_conv1d.data, c->conv_kernel, cd, T,
                         &conv, y));
    const eic_rstate mat = layer_state(rt, l, (int64_t)(c->conv_kernel - 1) * cd);   /* the matrices follow the window */
    const eic_delta_args a = {y, alpha, beta, (const float *)L->ssm_a.data, (const float *)L->ssm_dt.data, o,
                              c->ssm_k_heads, c->ssm_v_heads, c->ssm_head_dim, c->ssm_head_dim};
    if (!rt->long_runs) {   /* every step of a captured graph (T <= 16) */
        LCK(eic_delta_rule(rt->stream, &a, T, &mat));
    } else {   /* as the CPU: a run of EI_DELTA_CHUNK rows or more by chunks, a shorter one token by token */
        for (int32_t r = 0; r < rt->n_runs; r++) {
            const int32_t i = rt->h_runs[2 * r], n = rt->h_runs[2 * r + 1];
            eic_delta_args ar = a;
            ar.qkv += (int64_t)i * cd, ar.alpha += (int64_t)i * nv, ar.beta += (int64_t)i * nv, ar.o += (int64_t)i * inner;
            eic_rstate mr = mat;
            mr.slots += i, mr.keep += i;
            LCK((n >= EI_DELTA_CHUNK ? eic_delta_rule_chunked : eic_delta_rule)(rt->stream, &ar, n, &mr));
        }
    }
    LCK(eic_gated_norm(rt->stream, o, (const float *)L->ssm_norm.data, z, (int64_t)T * nv, c->ssm_head_dim, c->rms_eps));
    return block_out(rt, l, &L->ssm_out, o, inner, T, -1);
}

/* The attention block of layer l: QKV (with attn_norm), RoPE and the KV store, attention over the
 * ring in chunks, O into the residual. The layer's own head size and rotated dimensions (Gemma 4's
 * sliding and full layers differ); a KV-shared layer computes q only and attends over its source's KV. */
static cudaError_t attention_block(ei_cuda_runtime *rt, int l, int32_t T, int n_chunks, int n_chunks_l) {
    const ei_model_config *c = &rt->cfg;
    const ei_layer *L = &rt->layers[l];
    cudaStream_t s = rt->stream;
    const int hd = ei_layer_head_dim(c, l), stores = ei_layer_stores_kv(c, l);
    const int64_t d = c->n_embd, qd = (int64_t)c->n_head * hd, kvd = (int64_t)c->n_head_kv * hd;
    int32_t *slots = batch_arr(rt, rt->d_batch, 1), *pos = batch_arr(rt, rt->d_batch, 2);
    int32_t *cells = batch_arr(rt, rt->d_batch, 3), *ncells = batch_arr(rt, rt->d_batch, 4);
    int32_t *cells_l = batch_arr(rt, rt->d_batch, 6), *ncells_l = batch_arr(rt, rt->d_batch, 7);
    const int lora = rt->n_lora_groups > 0;
    const int local = ei_layer_is_local(c, l);

    const eic_qk_norm qkn = {c->has_qk_norm ? (const float *)L->q_norm.data : NULL,
                             c->has_qk_norm ? (const float *)L->k_norm.data : NULL, c->rms_eps, c->has_v_norm};
    const float *rc = local && rt->rope_cos_l ? rt->rope_cos_l : rt->rope_cos;
    const float *rsn = local && rt->rope_sin_l ? rt->rope_sin_l : rt->rope_sin;
    const int ring = local && rt->local_cells;   /* the layer's KV lives in the local ring */
    const eic_kv *kv = &rt->kv_view[l];
    /* attn_norm + Q, K, V: one launch unless the recipe mixes their types */
    /* gated attention: attn_q's rows are each head's query then its gate, into qg first */
    float *qout = c->has_attn_gate ? rt->qg : rt->q;
    const int64_t qrows = c->has_attn_gate ? 2 * qd : qd;
    const eic_mm_part qkv[3] = {{L->wq.data, (const float *)L->bq.data, qout, qrows, qrows},
                                {L->wk.data, (const float *)L->bk.data, rt->kc, kvd, kvd},
                                {L->wv.data, (const float *)L->bv.data, rt->vc, kvd, kvd}};
    const int qkv_types[3] = {L->wq.type, L->wk.type, L->wv.type};
    LCK(matmul_by_type(s, qkv, qkv_types, stores ? 3 : 1, d, rt->x, T, (const float *)L->attn_norm.data, c->rms_eps));
    if (lora && (lora_touches(rt, l, 0) || lora_touches(rt, l, 1) || lora_touches(rt, l, 2))) {
        /* the adapters read the normed input the fused launch never stores: onorm (the head's, later) */
        LCK(eic_rmsnorm(s, rt->x, (const float *)L->attn_norm.data, NULL, T, d, c->rms_eps, rt->onorm));
        LCK(lora_apply(rt, l, 0, rt->onorm, d, qout, qrows));
        LCK(lora_apply(rt, l, 1, rt->onorm, d, rt->kc, kvd));
        LCK(lora_apply(rt, l, 2, rt->onorm, d, rt->vc, kvd));
    }
    if (c->has_attn_gate) LCK(eic_split_gate(s, rt->qg, T, qd, hd, rt->q, rt->agate));
    /* a layer without RoPE: the same launch rotating no dimensions */
    LCK(eic_rope_store(s, rt->q, stores ? rt->kc : NULL, stores ? rt->vc : NULL, T, c->n_head, c->n_head_kv, hd,
                       ei_layer_uses_rope(c, l) ? ei_layer_rope_dim(c, l) : 0, c->rope_neox, rc, rsn, kv, 0, slots,
                       ring ? cells_l : cells, c->has_qk_norm || c->has_v_norm ? &qkn : NULL));
    for (int32_t t0 = 0; t0 < T; t0 += rt->attn_tokens) {
        const int32_t nt = T - t0 < rt->attn_tokens ? T - t0 : rt->attn_tokens;
        LCK(eic_attention(s, rt->q + t0 * qd, nt, c->n_head, kv, 0, slots + t0, pos + t0,
                          (ring ? ncells_l : ncells) + t0, ring ? rt->d_cell_pos_l : rt->d_cell_pos,
                          ring ? n_chunks_l : n_chunks, rt->part, rt->att + t0 * qd, c->attn_scale,
                          local ? c->swa_window : rt->p.slide_window, local ? 0 : rt->p.n_sink));
    }
    if (c->has_attn_gate) LCK(eic_sigmoid_gate(s, rt->att, rt->agate, (int64_t)T * qd));
    if (c->has_post_norms) {   /* Gemma 3: O, then its post-norm, into the residual */
        LCK(eic_matmul(s, L->wo.type, L->wo.data, d, qd, rt->att, qd, T, NULL, 0, rt->post, d));
        if (lora) LCK(lora_apply(rt, l, 3, rt->att, qd, rt->post, d));
        LCK(eic_rmsnorm_add(s, rt->post, (const float *)L->attn_post_norm.data, T, d, c->rms_eps, rt->x));
    } else {
        LCK(eic_matmul(s, L->wo.type, L->wo.data, d, qd, rt->att, qd, T, NULL, 1, rt->x, d));
        if (lora) LCK(lora_apply(rt, l, 3, rt->att, qd, rt->x, d));
    }
    return cudaSuccess;
}

/* Gemma 4's per-layer inputs of the step (per_layer.c's ei_per_layer_inputs): the projection of the
 * scaled token embedding / sqrt(n_embd), RMS-normed per layer, plus the token's row of the table (staged
 * in d_ple_rows by ei_cuda_forward) times sqrt(e), all / sqrt(2): ple [T][n_layer][e]. */
static cudaError_t per_layer_inputs(ei_cuda_runtime *rt, int32_t T) {
    const ei_model_config *c = &rt->cfg;
    const ei_globals *g = &rt->globals;
    cudaStream_t s = rt->stream;
    const int64_t d = c->n_embd, e = c->n_embd_per_layer, all = e * c->n_layer;
    LCK(eic_matmul(s, g->ple_model_proj.type, g->ple_model_proj.data, all, d, rt->x, d, T, NULL, 0, rt->ple_in, all));
    LCK(eic_scale(s, rt->ple_in, (int64_t)T * all, 1.0f / sqrtf((float)d)));
    LCK(eic_rmsnorm(s, rt->ple_in, (const float *)g->ple_proj_norm.data, NULL, (int64_t)T * c->n_layer, e, c->rms_eps,
                    rt->ple));
    LCK(eic_embed(s, rt->ple_type, rt->d_ple_rows, all, rt->d_iota, T, rt->ple_in));
    return eic_add_scaled(s, rt->ple, rt->ple_in, (int64_t)T * all, sqrtf((float)e), 1.0f / sqrtf(2.0f));
}

/* After layer l's FFN (ei_per_layer_block): x += post_norm(proj(gelu(inp_gate(x)) * ple[t][l])), then
 * x *= the layer's output scale. */
static cudaError_t per_layer_block(ei_cuda_runtime *rt, int l, int32_t T) {
    const ei_model_config *c = &rt->cfg;
    const ei_layer *L = &rt->layers[l];
    cudaStream_t s = rt->stream;
    const int64_t d = c->n_embd, e = c->n_embd_per_layer;
    if (e > 0) {
        LCK(eic_matmul(s, L->ple_inp_gate.type, L->ple_inp_gate.data, e, d, rt->x, d, T, NULL, 0, rt->ple_gate, e));
        LCK(eic_geglu_rows(s, rt->ple_gate, rt->ple + (int64_t)l * e, T, e, e * c->n_layer));
        LCK(eic_matmul(s, L->ple_proj.type, L->ple_proj.data, d, e, rt->ple_gate, e, T, NULL, 0, rt->post, d));
        LCK(eic_rmsnorm_add(s, rt->post, (const float *)L->ple_post_norm.data, T, d, c->rms_eps, rt->x));
    }
    if (rt->out_scale[l] != 1.0f) LCK(eic_scale(s, rt->x, (int64_t)T * d, rt->out_scale[l]));
    return cudaSuccess;
}

/* Every launch of one step, on rt->stream; batch arrays already on the device.
 * Per attention layer: QKV (with attn_norm), rope_store, attention (chunks + merge), O,
 * gate/up/SwiGLU (with ffn_norm), down: 7 launches when Q, K, V share a type
 * and gate, up share one. A recurrent layer's mixing block is its own (shortconv_block,
 * deltanet_block); the FFN is the same. */
static cudaError_t launch_step(ei_cuda_runtime *rt, int32_t T, int32_t n_out, int n_chunks, int n_chunks_l) {
    const ei_model_config *c = &rt->cfg;
    cudaStream_t s = rt->stream;
    const int64_t d = c->n_embd;
    int32_t *tokens = batch_arr(rt, rt->d_batch, 0), *slots = batch_arr(rt, rt->d_batch, 1);
    int32_t *pos = batch_arr(rt, rt->d_batch, 2), *cells = batch_arr(rt, rt->d_batch, 3);
    int32_t *orows = batch_arr(rt, rt->d_batch, 5), *cells_l = batch_arr(rt, rt->d_batch, 6);
    const float *freqs = (const float *)rt->globals.rope_freqs.data;
    const int lora = rt->n_lora_groups > 0;   /* never while capturing a graph (ei_cuda_forward) */

    LCK(eic_rope_tables(s, pos, T, c->rope_dim, c->rope_theta, c->rope_freq_scale, freqs, c->rope_attn_factor, rt->rope_cos, rt->rope_sin,
                        rt->d_cell_pos, slots, cells, rt->p.n_ctx));
    if (rt->local_cells)   /* the local ring's cell positions (rope_dim 0: no tables) */
        LCK(eic_rope_tables(s, pos, T, 0, 1.0f, 1.0f, NULL, 1.0f, NULL, NULL, rt->d_cell_pos_l, slots, cells_l,
                            rt->local_cells));
    if (rt->rope_cos_l)   /* sliding-window layers: their own base and dimensions, no frequency scaling (as the CPU) */
        LCK(eic_rope_tables(s, pos, T, c->rope_dim_swa > 0 ? c->rope_dim_swa : c->rope_dim,
                            c->rope_theta_local > 0 ? c->rope_theta_local : c->rope_theta, 1.0f,
                            NULL, c->rope_attn_factor, rt->rope_cos_l, rt->rope_sin_l,
                            NULL, slots, cells, rt->p.n_ctx));
    LCK(eic_embed(s, rt->globals.tok_embd.type, rt->globals.tok_embd.data, d, tokens, T, rt->x));
    if (c->embd_scale > 0 && c->embd_scale != 1.0f) LCK(eic_scale(s, rt->x, (int64_t)T * d, c->embd_scale));
    if (c->n_embd_per_layer > 0) LCK(per_layer_inputs(rt, T));
    for (int l = 0; l < c->n_layer; l++) {
        const ei_layer *L = &rt->layers[l];
        const int64_t ff = ei_layer_n_ff(c, l);
        const int kind = ei_layer_kind_of(c, l);
        if (kind == EI_LAYER_SHORTCONV) LCK(shortconv_block(rt, l, T));
        else if (kind == EI_LAYER_DELTANET) LCK(deltanet_block(rt, l, T));
        else LCK(attention_block(rt, l, T, n_chunks, n_chunks_l));
        /* ffn_norm + gate, up and SwiGLU: one launch when gate and up share a type (and no adapter
         * needs gate and up apart) */
        const float *fn = (const float *)L->ffn_norm.data;
        const int lora_gu = lora && (lora_touches(rt, l, 4) || lora_touches(rt, l, 5));
        if (L->w_gate.type == L->w_up.type && !c->act_gelu && !lora_gu) {
            LCK(eic_matmul_glu(s, L->w_gate.type, L->w_gate.data, NULL, L->w_up.data, NULL, ff, d, rt->x, d, T, fn,
                               c->rms_eps, rt->gate, ff));
        } else {
            const eic_mm_part gu[2] = {{L->w_gate.data, NULL, rt->gate, ff, ff}, {L->w_up.data, NULL, rt->up, ff, ff}};
            const int gu_types[2] = {L->w_gate.type, L->w_up.type};
            LCK(matmul_by_type(s, gu, gu_types, 2, d, rt->x, T, fn, c->rms_eps));
            if (lora_gu) {
                LCK(eic_rmsnorm(s, rt->x, fn, NULL, T, d, c->rms_eps, rt->onorm));
                LCK(lora_apply(rt, l, 4, rt->onorm, d, rt->gate, ff));
                LCK(lora_apply(rt, l, 5, rt->onorm, d, rt->up, ff));
            }
            LCK((c->act_gelu ? eic_geglu : eic_swiglu)(s, rt->gate, rt->up, (int64_t)T * ff));
        }
        if (c->has_post_norms) {
            LCK(eic_matmul(s, L->w_down.type, L->w_down.data, d, ff, rt->gate, ff, T, NULL, 0, rt->post, d));
            if (lora) LCK(lora_apply(rt, l, 6, rt->gate, ff, rt->post, d));
            LCK(eic_rmsnorm_add(s, rt->post, (const float *)L->ffn_post_norm.data, T, d, c->rms_eps, rt->x));
        } else {
            LCK(eic_matmul(s, L->w_down.type, L->w_down.data, d, ff, rt->gate, ff, T, NULL, 1, rt->x, d));
            if (lora) LCK(lora_apply(rt, l, 6, rt->gate, ff, rt->x, d));
        }
        LCK(per_layer_block(rt, l, T));   /* Gemma 4: per-layer input, output scale */
    }
    if (n_out > 0) {
        const ei_weight *head = rt->globals.output.data ? &rt->globals.output : &rt->globals.tok_embd;
        LCK(eic_rmsnorm(s, rt->x, (const float *)rt->globals.output_norm.data, orows, n_out, d, c->rms_eps, rt->onorm));
        LCK(eic_matmul(s, head->type, head->data, c->n_vocab, d, rt->onorm, d, n_out, NULL, 0, rt->logits, c->n_vocab));
        if (lora) LCK(lora_apply(rt, -1, 7, rt->onorm, d, rt->logits, c->n_vocab));   /* an untied head's */
        if (c->final_softcap > 0) LCK(eic_softcap(s, rt->logits, (int64_t)n_out * c->n_vocab, c->final_softcap));
    }
    return cudaSuccess;
}

/* Replays (capturing on first use) the graph of a decode-sized step; returns
 * 0 when the step ran, -1 when graphs are off or capture failed (run directly). */
static int run_graph(ei_cuda_runtime *rt, int32_t T, int32_t n_out) {
    if (rt->graphs_broken || T > MAX_GRAPH_TOKENS) return -1;
    cudaGraphExec_t *ex = &rt->graphs[T][n_out];
    if (!*ex) {
        cudaGraph_t g = NULL;
        if (cudaStreamBeginCapture(rt->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
            cudaGetLastError();
            rt->graphs_broken = 1;
            return -1;
        }
        const cudaError_t le = launch_step(rt, T, n_out, rt->max_chunks, rt->max_chunks_l);
        const cudaError_t ee = cudaStreamEndCapture(rt->stream, &g);
        if (le != cudaSuccess || ee != cudaSuccess || !g || cudaGraphInstantiate(ex, g, 0) != cudaSuccess) {
            cudaGetLastError();
            if (g) cudaGraphDestroy(g);
            *ex = NULL;
            rt->graphs_broken = 1;
            return -1;
        }
        cudaGraphDestroy(g);
    }
    return cudaGraphLaunch(*ex, rt->stream) == cudaSuccess ? 0 : -1;
}

extern "C" ei_status ei_cuda_forward(ei_cuda_runtime *rt, int32_t n_tokens, const int32_t *tokens,
                                     const int32_t *slots, const int32_t *pos, const int32_t *cells, int32_t n_out,
                                     const int32_t *out_rows, float *logits, int32_t n_keep,
                                     const int32_t *keep_rows) {
    if (!rt) return eic_fail(EI_ERR_INVALID_ARG, "forward: null runtime");
    const ei_model_config *c = &rt->cfg;
    if (n_tokens < 1 || n_tokens > rt->p.max_batch)
        return eic_fail(EI_ERR_RANGE, "batch of %d tokens outside [1, max_batch=%d]", n_tokens, rt->p.max_batch);
    if (!tokens || !slots || !pos || !cells) return eic_fail(EI_ERR_INVALID_ARG, "forward: null batch array");
    if (n_out < 0 || n_out > n_tokens || (n_out > 0 && !out_rows))
        return eic_fail(EI_ERR_INVALID_ARG, "forward: n_out=%d must be in [0, n_tokens=%d], with out_rows when > 0",
                        n_out, n_tokens);
    for (int32_t i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return eic_fail(EI_ERR_RANGE, "token id %d at batch index %d outside [0, %d)", tokens[i], i, c->n_vocab);
        if (slots[i] < 0 || slots[i] >= rt->p.n_slots)
            return eic_fail(EI_ERR_RANGE, "slot %d outside [0, %d)", slots[i], rt->p.n_slots);
        if (cells[i] < 0 || cells[i] >= rt->p.n_ctx)
            return eic_fail(EI_ERR_RANGE, "cell %d outside [0, %d)", cells[i], rt->p.n_ctx);
        if (pos[i] < 0) return eic_fail(EI_ERR_RANGE, "position %d is negative", pos[i]);
    }
    for (int32_t j = 0; j < n_out; j++)
        if (out_rows[j] < 0 || out_rows[j] >= n_tokens)
            return eic_fail(EI_ERR_RANGE, "output row %d outside [0, %d)", out_rows[j], n_tokens);
    if (n_keep < 0 || (n_keep > 0 && !keep_rows))
        return eic_fail(EI_ERR_INVALID_ARG, "forward: bad keep rows (n_keep=%d)", n_keep);
    for (int32_t j = 0; j < n_keep; j++)
        if (keep_rows[j] < 0 || keep_rows[j] >= n_tokens)
            return eic_fail(EI_ERR_RANGE, "keep row %d outside [0, %d)", keep_rows[j], n_tokens);

    ei_status st = state_check(rt, n_tokens, slots, pos);
    if (st != EI_OK) return st;
    if ((st = use_device(rt)) != EI_OK) return st;
    rt->last_n_out = 0;   /* until this step succeeds, argmax / topk have no rows to read */

    /* Host bookkeeping, as layer 0 of the CPU pass does it before any attention. */
    for (int32_t i = 0; i < n_tokens; i++) {
        rt->h_cell_pos[(size_t)slots[i] * rt->p.n_ctx + cells[i]] = pos[i];
        if (rt->h_n_used[slots[i]] <= cells[i]) rt->h_n_used[slots[i]] = cells[i] + 1;
        if (rt->local_cells) {
            const int32_t lc = pos[i] % rt->local_cells;
            rt->h_cell_pos_l[(size_t)slots[i] * rt->local_cells + lc] = pos[i];
            if (rt->h_n_used_l[slots[i]] <= lc) rt->h_n_used_l[slots[i]] = lc + 1;
        }
    }
    int32_t used_l = 0;
    int32_t used = 0;
    int32_t *hb = rt->h_batch;
    const size_t B = (size_t)rt->p.max_batch;
    for (int32_t i = 0; i < n_tokens; i++) {
        hb[i] = tokens[i];
        hb[B + i] = slots[i];
        hb[2 * B + i] = pos[i];
        hb[3 * B + i] = cells[i];
        hb[4 * B + i] = rt->h_n_used[slots[i]];
        if (hb[4 * B + i] > used) used = hb[4 * B + i];
        if (rt->local_cells) {
            hb[6 * B + i] = pos[i] % rt->local_cells;
            hb[7 * B + i] = rt->h_n_used_l[slots[i]];
            if (hb[7 * B + i] > used_l) used_l = hb[7 * B + i];
        }
    }
    for (int32_t j = 0; j < n_out; j++) hb[5 * B + j] = out_rows[j];
    for (int32_t i = 0; i < n_tokens; i++) hb[8 * B + i] = -1;
    for (int32_t j = 0; rt->d_state && j < n_keep; j++)   /* the copy each keep row fills */
        hb[8 * B + keep_rows[j]] = place_kept(rt, slots[keep_rows[j]], pos[keep_rows[j]] + 1);
    rt->n_runs = rt->long_runs = 0;
    for (int32_t i = 0; rt->d_state && i < n_tokens;) {   /* recurrent.c's runs: cut at a slot change or keep row */
        int32_t e = i;
        while (e + 1 < n_tokens && slots[e + 1] == slots[i] && hb[8 * B + e] < 0) e++;
        rt->h_runs[2 * rt->n_runs] = i, rt->h_runs[2 * rt->n_runs + 1] = e - i + 1;
        rt->long_runs |= e - i + 1 >= EI_DELTA_CHUNK;
        rt->n_runs++;
        i = e + 1;
    }
    st = eic_check(cudaMemcpyAsync(rt->d_batch, hb, EIC_BATCH_ARRAYS * B * 4, cudaMemcpyHostToDevice, rt->stream),
                             "batch upload");
    if (st != EI_OK) return st;
    if (rt->ple_host) {   /* Gemma 4: the tokens' rows of the per-layer table, from the host mapping */
        const size_t rb = (size_t)rt->ple_row_bytes;
        for (int32_t i = 0; i < n_tokens; i++) memcpy(rt->h_ple_rows + i * rb, rt->ple_host + (size_t)tokens[i] * rb, rb);
        if ((st = eic_check(cudaMemcpyAsync(rt->d_ple_rows, rt->h_ple_rows, (size_t)n_tokens * rb, cudaMemcpyHostToDevice,
                                            rt->stream), "per-layer rows upload")) != EI_OK)
            return st;
    }
    if ((st = lora_plan(rt, n_tokens, slots, n_out, out_rows)) != EI_OK) return st;
    /* a step with adapters runs its launches directly: a graph replays the rows and groups it was
     * captured with */
    if (rt->n_lora_groups || run_graph(rt, n_tokens, n_out) != 0) {
        const int n_chunks = (used + EIC_ATTN_CHUNK - 1) / EIC_ATTN_CHUNK;
        const int n_chunks_l = (used_l + EIC_ATTN_CHUNK - 1) / EIC_ATTN_CHUNK;
        if ((st = eic_check(launch_step(rt, n_tokens, n_out, n_chunks > 0 ? n_chunks : 1, n_chunks_l > 0 ? n_chunks_l : 1),
                            "forward launch")) != EI_OK)
            return st;
    }
    if (n_out > 0 && logits &&   /* NULL: the logits stay on the device for argmax / topk */
        (st = eic_check(cudaMemcpyAsync(logits, rt->logits, (size_t)n_out * c->n_vocab * 4, cudaMemcpyDeviceToHost,
                                        rt->stream), "logits download")) != EI_OK)
        return st;
    if ((st = eic_check(cudaStreamSynchronize(rt->stream), "forward")) != EI_OK) return st;
    for (int32_t i = 0; rt->d_state && i < n_tokens; i++) rt->state_seen[slots[i]] = pos[i] + 1;
    rt->last_n_out = n_out;
    return EI_OK;
}

extern "C" ei_status ei_cuda_argmax(ei_cuda_runtime *rt, int32_t n_out, int32_t *out) {
    if (!rt || !out) return eic_fail(EI_ERR_INVALID_ARG, "argmax: null argument");
    if (n_out < 1 || n_out > rt->last_n_out)
        return eic_fail(EI_ERR_RANGE, "argmax of %d rows, the last forward produced %d", n_out, rt->last_n_out);
    ei_status st = use_device(rt);
    if (st != EI_OK) return st;
    st = eic_check(eic_argmax(rt->stream, rt->logits, n_out, rt->cfg.n_vocab, rt->d_top_ids), "argmax");
    if (st != EI_OK) return st;
    if ((st = eic_check(cudaMemcpyAsync(out, rt->d_top_ids, (size_t)n_out * 4, cudaMemcpyDeviceToHost, rt->stream),
                        "argmax download")) != EI_OK)
        return st;
    return eic_check(cudaStreamSynchronize(rt->stream), "argmax");
}

extern "C" ei_status ei_cuda_topk(ei_cuda_runtime *rt, int32_t n_out, int32_t k, int32_t *ids, float *vals) {
    if (!rt || !ids || !vals) return eic_fail(EI_ERR_INVALID_ARG, "topk: null argument");
    if (n_out < 1 || n_out > rt->last_n_out)
        return eic_fail(EI_ERR_RANGE, "topk of %d rows, the last forward produced %d", n_out, rt->last_n_out);
    if (k < 1 || k > EIC_TOPK_MAX || k > rt->cfg.n_vocab)
        return eic_fail(EI_ERR_RANGE, "topk: k=%d outside [1, %d]", k,
                        rt->cfg.n_vocab < EIC_TOPK_MAX ? rt->cfg.n_vocab : EIC_TOPK_MAX);
    const size_t n = (size_t)n_out * k;
    ei_status st = use_device(rt);
    if (st == EI_OK)
        st = eic_check(eic_topk(rt->stream, rt->logits, n_out, rt->cfg.n_vocab, k, rt->d_top_ids, rt->d_top_vals),
                       "topk");
    if (st == EI_OK)
        st = eic_check(cudaMemcpyAsync(ids, rt->d_top_ids, n * 4, cudaMemcpyDeviceToHost, rt->stream), "topk download");
    if (st == EI_OK)
        st = eic_check(cudaMemcpyAsync(vals, rt->d_top_vals, n * 4, cudaMemcpyDeviceToHost, rt->stream), "topk download");
    if (st != EI_OK) return st;
    return eic_check(cudaStreamSynchronize(rt->stream), "topk");
}
