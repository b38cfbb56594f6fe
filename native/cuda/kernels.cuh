/* Internal interface of the CUDA backend: error helpers and the launchers of
 * every op of the forward pass (kernels.cu). All launchers are asynchronous on
 * the given stream and return the launch's cudaError_t. */
#ifndef EI_CUDA_KERNELS_CUH
#define EI_CUDA_KERNELS_CUH
#include <cuda_runtime.h>
#include <stdint.h>

#include "edgeinfer_cuda.h"
#include "edgeinfer_layout.h"   /* EI_DELTA_CHUNK */

/* Cells per attention chunk: the same fixed chunking as the CPU (attention.h). */
#define EIC_ATTN_CHUNK 256
#define EIC_PART_FLOATS(hd) ((hd) + 2)
#define EIC_ATTN_WARPS 8
/* Shared memory of an attention block: q[g][hd] (reused for the warps' V sums) and the scores. */
#define EIC_ATTN_SMEM(g, hd) \
    (sizeof(float) * ((size_t)((g) > EIC_ATTN_WARPS ? (g) : EIC_ATTN_WARPS) * (hd) + (size_t)(g) * EIC_ATTN_CHUNK))
#define EIC_MAX_HEAD_DIM 512   /* Gemma 4's full-attention heads */
#define EIC_MAX_GROUP 32

/* Records a message for ei_cuda_last_error() and returns st. */
ei_status eic_fail(ei_status st, const char *fmt, ...);
/* EI_OK when e == cudaSuccess, else a failure naming `what` and the CUDA error. */
ei_status eic_check(cudaError_t e, const char *what);

/* Block geometry of a weight type (0 if unsupported) and bytes of a row of n. */
int eic_type_block(int type, int *elems, int *bytes);
int64_t eic_row_bytes(int type, int64_t n);
int eic_type_supported(int type);   /* a matmul / embedding weight type we have kernels for */

/* y[t*ldy + r] = bias[r] + (accumulate ? y : 0) + W[r] . x[t*ldx ..], r < n_rows, t < n_tok. */
cudaError_t eic_matmul(cudaStream_t s, int type, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
                       int64_t ldx, int64_t n_tok, const float *bias, int accumulate, float *y, int64_t ldy);
#define EIC_MM_MAX_PARTS 3
/* One weight of a fused matmul: y[t*ldy + r] (r < n_rows) from row r of w; bias may be NULL. */
typedef struct {
    const void *w;
    const float *bias;
    float *y;
    int64_t n_rows, ldy;
} eic_mm_part;
/* The matmuls of n_parts (<= EIC_MM_MAX_PARTS) weights of one type and n_cols on the same
 * x in one launch (Q, K, V), each as eic_matmul. When norm is not NULL the input is
 * rmsnorm(x[t], eps) * norm instead of x (attn_norm / ffn_norm fused into the matmul). */
cudaError_t eic_matmul_multi(cudaStream_t s, int type, const eic_mm_part *parts, int n_parts, int64_t n_cols,
                             const float *x, int64_t ldx, int64_t n_tok, const float *norm, float eps, int accumulate);
/* y[t*ldy + r] = silu(g) * u with g, u the rows r of w_gate and w_up (one type) dotted with
 * the input as eic_matmul_multi's, plus b_gate[r], b_up[r] (may be NULL): gate, up and
 * SwiGLU in one launch. */
cudaError_t eic_matmul_glu(cudaStream_t s, int type, const void *w_gate, const float *b_gate, const void *w_up,
                           const float *b_up, int64_t n_rows, int64_t n_cols, const float *x, int64_t ldx,
                           int64_t n_tok, const float *norm, float eps, float *y, int64_t ldy);
/* out[t*ne0 ..] = dequantized row tokens[t]. */
cudaError_t eic_embed(cudaStream_t s, int type, const void *table, int64_t ne0, const int32_t *tokens,
                      int64_t n_tok, float *out);
/* out[t*n ..] = rmsnorm(x[row(t)*n ..]) * w, row(t) = rows ? rows[t] : t. */
cudaError_t eic_rmsnorm(cudaStream_t s, const float *x, const float *w, const int32_t *rows, int64_t n_tok, int64_t n,
                        float eps, float *out);
/* x[t*n ..] += rmsnorm(y[t*n ..]) * w: a post-norm (Gemma 3) joining the residual. */
cudaError_t eic_rmsnorm_add(cudaStream_t s, const float *y, const float *w, int64_t n_tok, int64_t n, float eps,
                            float *x);
/* x[i] *= a (Gemma's embedding scale); x[i] = cap * tanh(x[i] / cap) (final logit softcap). */
cudaError_t eic_scale(cudaStream_t s, float *x, int64_t n, float a);
cudaError_t eic_softcap(cudaStream_t s, float *x, int64_t n, float cap);
/* gate[i] = gelu_tanh(gate[i]) * up[i] (Gemma's GeGLU). */
cudaError_t eic_geglu(cudaStream_t s, float *gate, const float *up, int64_t n);
/* gate[r*n + i] = gelu_tanh(gate[r*n + i]) * up[r*ld_up + i], r < n_rows, i < n (a strided up: Gemma 4's
 * per-layer input of one layer). */
cudaError_t eic_geglu_rows(cudaStream_t s, float *gate, const float *up, int64_t n_rows, int64_t n, int64_t ld_up);
/* x[i] = (x[i] + a * y[i]) * b. */
cudaError_t eic_add_scaled(cudaStream_t s, float *x, const float *y, int64_t n, float a, float b);
/* cos/sin[t*half + i] of pos[t] * freq_scale * theta^(-2i/rope_dim) / freqs[i] (double math),
 * times mscale (LongRoPE's attention factor; <= 0: 1). When cell_pos is not NULL, also cell_pos[slots[t]*n_ctx + cells[t]] = pos[t]. */
cudaError_t eic_rope_tables(cudaStream_t s, const int32_t *pos, int64_t n_tok, int rope_dim, float theta,
                            float freq_scale, const float *freqs, float mscale, float *cos_t, float *sin_t,
                            int32_t *cell_pos, const int32_t *slots, const int32_t *cells, int32_t n_ctx);
/* RoPE on q[t][n_head][hd] in place; when kc is not NULL also on kc[t][n_head_kv][hd], then
 * K and V of every token go to their ring cell (f16) of `layer`. */
typedef struct {
    uint16_t *k, *v;        /* the arena: slot s at s * slot_stride, then [layer][kv_head][cell][hd] */
    int32_t n_layer, n_head_kv, n_ctx, hd;
    int64_t slot_stride;    /* elements from one slot to the next (0: n_layer * n_head_kv * n_ctx * hd) */
} eic_kv;
/* Per-head RMSNorm weights (head_dim each) applied to q / k heads before RoPE (NULL: none); v: 1 to
 * RMS-norm each v head without a weight before it is stored (Gemma 4). */
typedef struct {
    const float *q, *k;
    float eps;
    int v;
} eic_qk_norm;
cudaError_t eic_rope_store(cudaStream_t s, float *q, float *kc, const float *vc, int64_t n_tok, int n_head,
                           int n_head_kv, int hd, int rope_dim, int neox, const float *cos_t, const float *sin_t,
                           const eic_kv *kv, int layer, const int32_t *slots, const int32_t *cells,
                           const eic_qk_norm *qk_norm);
/* gate[i] = silu(gate[i]) * up[i]. */
cudaError_t eic_swiglu(cudaStream_t s, float *gate, const float *up, int64_t n);
/* out[t][h*hd ..] for tokens t < n_tok: attention of q[t] over its slot's cells
 * [0, n_cells[t]) of `layer` with 0 <= cell_pos <= pos[t], in n_chunks chunks of
 * EIC_ATTN_CHUNK cells merged in order. part holds n_tok*n_head*n_chunks*(hd+2) floats. */
cudaError_t eic_attention(cudaStream_t s, const float *q, int64_t n_tok, int n_head, const eic_kv *kv, int layer,
                          const int32_t *slots, const int32_t *pos, const int32_t *n_cells, const int32_t *cell_pos,
                          int n_chunks, float *part, float *out, float scale, int32_t window, int32_t keep_below);
/* scale: scores = q.k * scale (0: 1/sqrt(hd)); window > 0: only cells with pos - window < cell_pos
 * or cell_pos < keep_below are visible (a sliding-window layer: keep_below 0; a ring with slack:
 * its sinks). */
/* LoRA, for the n gathered rows rows[i] of x: t[i*rank + k] = A[k] . x[rows[i]*ldx ..] (A: rank rows
 * of n_cols f32), then y[rows[i]*ldy + r] += scale[i] * B[r] . t[i*rank ..] (B: n_out rows of rank f32). */
cudaError_t eic_lora_down(cudaStream_t s, const float *A, int rank, int64_t n_cols, const float *x, int64_t ldx,
                          const int32_t *rows, int64_t n, float *t);
cudaError_t eic_lora_up(cudaStream_t s, const float *B, int64_t n_out, int rank, const float *t, const int32_t *rows,
                        const float *scale, int64_t n, float *y, int64_t ldy);
/* out[j] = argmax of row j of x (n_rows x n). */
cudaError_t eic_argmax(cudaStream_t s, const float *x, int64_t n_rows, int64_t n, int32_t *out);
/* ids[j*k + i], vals[j*k + i], i < k: the k largest of row j of x (n_rows x n), value descending,
 * ties to the lower id; NaN counts as -inf. 1 <= k <= min(n, EIC_TOPK_MAX). */
#define EIC_TOPK_MAX 256
cudaError_t eic_topk(cudaStream_t s, const float *x, int64_t n_rows, int64_t n, int k, int32_t *ids, float *vals);
/* ---- recurrent layers (LFM2's short convolution, Qwen3.5's Gated DeltaNet) ----
 * A layer's per-slot state: the live block of slot s at state + s * stride + off, its kept copy k
 * at snap + (s * n_snap + k) * stride + off (the CPU's layout, native/src/state.h). keep[t]: the
 * copy row t fills with the state after it, -1: none. slots / keep: [n_tok] on the device. */
typedef struct {
    float *state, *snap;
    int64_t stride, off;
    int32_t n_snap;
    const int32_t *slots, *keep;
} eic_rstate;
#define EIC_CONV_MAX_K 16
#define EIC_MAX_SSM_DK 128
#define EIC_L2_EPS 1e-6f
enum { EIC_CONV_SHORTCONV = 0, EIC_CONV_SILU = 1 };
/* Causal depthwise conv1d with state (taps w[c * K + k]), window [K - 1][ch] at the layer's block.
 * EIC_CONV_SHORTCONV: in [t][3 ch] = B, C, x; y = C * conv(B * x) (LFM2). EIC_CONV_SILU: in [t][ch];
 * y = silu(conv(in)) (the delta net's qkv). A slot's rows run in order; slots may interleave. */
cudaError_t eic_conv1d_state(cudaStream_t s, int mode, const float *in, const float *w, int K, int64_t ch,
                             int64_t n_tok, const eic_rstate *rs, float *y);
/* The gated delta rule of nv value heads (head h reads key head h % nk) over qkv [t][q nk*dk, k nk*dk,
 * v nv*dv] (after the conv): q, k L2-normed (q also times 1/sqrt(dk)), g = a[h] softplus(alpha + dt[h]),
 * beta = sigmoid(beta); o [t][nv*dv]; the state [nv][dk][dv] at rs (off: the matrix's). dk <= EIC_MAX_SSM_DK. */
typedef struct {
    const float *qkv, *alpha, *beta, *a, *dt;
    float *o;
    int nk, nv, dk, dv;
} eic_delta_args;
cudaError_t eic_delta_rule(cudaStream_t s, const eic_delta_args *a, int64_t n_tok, const eic_rstate *rs);
/* The same over one slot's run of n_tok rows (rs.slots[0] for all) by chunks of EI_DELTA_CHUNK (the
 * CPU's ei_delta_chunked: matrix work within a chunk, one state update per chunk); the state is kept
 * after the last row only (when rs.keep[n_tok - 1] >= 0). */
cudaError_t eic_delta_rule_chunked(cudaStream_t s, const eic_delta_args *a, int64_t n_tok, const eic_rstate *rs);
/* x[r] = x[r] / sqrt(mean x[r]^2 + eps) * w * silu(gate[r]), n_rows rows of d. */
cudaError_t eic_gated_norm(cudaStream_t s, float *x, const float *w, const float *gate, int64_t n_rows, int d,
                           float eps);
/* Gated attention: qg [t][head][query hd, gate hd] -> q [t][qd], gate [t][qd]; x[i] *= sigmoid(gate[i]). */
cudaError_t eic_split_gate(cudaStream_t s, const float *qg, int64_t n_tok, int64_t qd, int hd, float *q, float *gate);
cudaError_t eic_sigmoid_gate(cudaStream_t s, float *x, const float *gate, int64_t n);
#endif
