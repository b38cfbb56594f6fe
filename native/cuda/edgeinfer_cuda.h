/* edgeinfer CUDA backend: a separate shared library (libedgeinfer_cuda.so),
 * loaded at run time with cffi ABI mode (edgeinfer/backends/cuda.py). CPU-only
 * installs never build or link it.
 *
 * Same rules as edgeinfer.h: no function exits or aborts; each returns an
 * ei_status (the enum of edgeinfer.h) and ei_cuda_last_error() gives a message
 * for the calling thread. The batch contract of ei_cuda_forward is ei_forward's.
 * edgeinfer/backends/cuda.py builds its cffi declarations from this header (the
 * build copies it into edgeinfer/backends/include/; tests/test_cuda.py checks the
 * copy is current).
 */
#ifndef EDGEINFER_CUDA_H
#define EDGEINFER_CUDA_H
#include <stddef.h>
#include <stdint.h>
#include "edgeinfer.h"
#ifdef __cplusplus
extern "C" {
#endif

const char *ei_cuda_last_error(void);
const char *ei_cuda_version(void);

/* Number of CUDA devices; < 0 when the driver or runtime cannot be used
 * (no driver, no device, driver too old): ei_cuda_last_error() says why. */
int ei_cuda_device_count(void);

typedef struct {
    char name[256];
    int32_t cc_major, cc_minor;
    int32_t sm_count;
    int32_t integrated;        /* 1: shares memory with the host (Jetson) */
    uint64_t total_bytes, free_bytes;
    int32_t driver_version, runtime_version;   /* e.g. 13000 */
} ei_cuda_device_info;

int ei_cuda_get_device_info(int device, ei_cuda_device_info *out);

/* One weight as the GGUF file holds it (host memory; copied to the device at
 * creation). layer = -1 for global roles; role is an ei_tensor_role (edgeinfer_roles.h,
 * shared with the CPU runtime). */
typedef struct {
    int32_t layer, role, type;
    int64_t ne0, ne1;
    const void *data;
} ei_cuda_tensor;

typedef struct {
    int32_t device;
    int32_t n_slots, n_ctx, max_batch;
    int32_t use_graphs;        /* 1: capture decode steps (n_tokens <= 16) as CUDA Graphs */
    int32_t drop_host_pages;   /* 1: tensors are a read-only file mapping; drop their pages after
                                  upload so the host keeps no second copy (Jetson) */
    int32_t n_sink, slide_window;  /* as ei_runtime_params: with slide_window > 0 a token at pos
                                      sees positions [0, n_sink) and (pos - slide_window, pos] */
    int32_t n_snapshots;       /* as ei_runtime_params: recurrent models' kept state copies per slot */
} ei_cuda_params;

/* Bytes the runtime will allocate on the device, as sized before allocation. */
typedef struct {
    uint64_t weights, kv, scratch, total;
    uint64_t state;            /* recurrent layers: each slot's live state and its n_snapshots copies */
} ei_cuda_sizes;

typedef struct ei_cuda_runtime ei_cuda_runtime;

/* Sizes everything, checks it fits the device's free memory (a clear
 * EI_ERR_OUT_OF_MEMORY with the numbers when not), uploads the weights and
 * allocates the KV ring [slot][layer][kv_head][cell][head_dim] f16 once (attention
 * layers only) and, for hybrids (LFM2's short convolutions, Qwen3.5's Gated DeltaNet),
 * the recurrent states with ei_runtime's layout and rules (state.h).
 * sizes (optional) gets the figures even when the model does not fit. */
ei_status ei_cuda_runtime_create(const ei_model_config *cfg, const ei_cuda_tensor *tensors, int32_t n_tensors,
                                 const ei_cuda_params *p, ei_cuda_sizes *sizes, ei_cuda_runtime **out);
void ei_cuda_runtime_free(ei_cuda_runtime *rt);
ei_status ei_cuda_runtime_sizes(const ei_cuda_runtime *rt, ei_cuda_sizes *out);
/* As ei_runtime_clear_slot / forget_from / restore_state / drop_state. */
ei_status ei_cuda_clear_slot(ei_cuda_runtime *rt, int32_t slot);
ei_status ei_cuda_forget_from(ei_cuda_runtime *rt, int32_t slot, int32_t pos);
ei_status ei_cuda_restore_state(ei_cuda_runtime *rt, int32_t slot, int32_t n);
ei_status ei_cuda_drop_state(ei_cuda_runtime *rt, int32_t slot, int32_t n);
/* As ei_runtime_copy_prefix: slot dst holds slot src's positions [0, n) (src's cell c holds position
 * c for c < n, else EI_ERR_STATE): the KV cells of every storing layer (a sliding-window ring: the
 * window the next token sees, else EI_ERR_STATE) and, for hybrids, the recurrent state after n
 * positions (a kept copy, or src's live state when it has seen n; EI_ERR_STATE when neither), which
 * dst also keeps. src == dst: forget_from(n) and restore_state(n). */
ei_status ei_cuda_copy_prefix(ei_cuda_runtime *rt, int32_t src, int32_t dst, int32_t n);
/* As ei_forward (keep_rows included), except that logits may be NULL with n_out > 0: the n_out
 * rows are computed but stay on the device, for ei_cuda_argmax / ei_cuda_topk (no n_out x n_vocab
 * download). */
ei_status ei_cuda_forward(ei_cuda_runtime *rt, int32_t n_tokens, const int32_t *tokens, const int32_t *slots,
                          const int32_t *pos, const int32_t *cells, int32_t n_out, const int32_t *out_rows,
                          float *logits, int32_t n_keep, const int32_t *keep_rows);
/* out[j] = argmax of logits row j of the last forward (on the device), j < n_out. */
ei_status ei_cuda_argmax(ei_cuda_runtime *rt, int32_t n_out, int32_t *out);
/* ids[j*k + i], vals[j*k + i] (i < k): the k largest logits of row j < n_out of the last forward
 * (on the device), value descending, ties to the lower id; NaN counts as -inf. 1 <= k <= 256 and
 * k <= n_vocab, else EI_ERR_RANGE. */
ei_status ei_cuda_topk(ei_cuda_runtime *rt, int32_t n_out, int32_t k, int32_t *ids, float *vals);

/* ---- LoRA adapters: ei_lora / ei_runtime_set_slot_loras of edgeinfer.h on the device ----
 * An adapter belongs to one runtime. ei_cuda_lora_set copies a float32 pair, A [rank][ne0] and
 * B [ne1][rank] for a weight of ne1 rows of ne0 (Q, K, V, O, gate, up, down or the output head),
 * to the device: the caller's arrays may go once it returns. A slot with adapters computes
 * W x + sum_i scale_i B_i (A_i x) for every adapted W; slots with different adapters share one
 * forward (a step in which a slot has adapters runs without CUDA Graphs). Detach (n = 0) before
 * freeing an adapter. */
typedef struct ei_cuda_lora ei_cuda_lora;
ei_status ei_cuda_lora_create(ei_cuda_runtime *rt, ei_cuda_lora **out);
ei_status ei_cuda_lora_set(ei_cuda_lora *a, int layer, int role, int32_t rank, const float *A, const float *B);
size_t ei_cuda_lora_bytes(const ei_cuda_lora *a);
void ei_cuda_lora_free(ei_cuda_lora *a);
ei_status ei_cuda_runtime_set_slot_loras(ei_cuda_runtime *rt, int slot, int n, ei_cuda_lora *const *loras,
                                         const float *scales);

#ifdef __cplusplus
}
#endif
#endif
