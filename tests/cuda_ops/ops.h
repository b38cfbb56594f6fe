/* Single CUDA ops on host arrays, for tests only (tests/test_cuda.py): never part of the
 * shipped libedgeinfer_cuda.so. ops.cu is built with native/cuda/kernels.cu and forward.cu
 * into the simulator library (scripts/build_cuda_sim.sh) and, for a real GPU, into
 * libedgeinfer_cuda_testops.so (scripts/build_cuda_testops.sh).
 *
 * Each op copies in, runs the kernel the forward pass uses, copies out, and checks guard
 * bytes around every device output (EI_ERR_STATE when a kernel wrote outside its buffer).
 * Errors as in edgeinfer_cuda.h: an ei_status, with ei_cuda_last_error() saying why. */
#ifndef EDGEINFER_CUDA_TEST_OPS_H
#define EDGEINFER_CUDA_TEST_OPS_H
#include "edgeinfer_cuda.h"
#ifdef __cplusplus
extern "C" {
#endif

/* y[t*n_rows + r] = bias[r] + (accumulate ? y[..] : 0) + dot(W row r, x[t*n_cols ..]); bias may be NULL. */
ei_status ei_cuda_op_matmul(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
                            int64_t n_tok, const float *bias, int32_t accumulate, float *y);
/* The fused QKV launch: n_parts (1..3) weights of one type on the same input; for p < n_parts,
 * y[p][t*n_rows[p] + r] = bias[p][r] + dot(W_p row r, xn[t]), where xn[t] is x[t] RMS-normalized
 * (eps) times norm elementwise (the fused attn_norm / ffn_norm), or x[t] when norm is NULL.
 * bias may be NULL or hold NULLs. */
ei_status ei_cuda_op_matmul_multi(int32_t type, int32_t n_parts, const void *const *w, const int64_t *n_rows,
                                  int64_t n_cols, const float *x, int64_t n_tok, const float *const *bias,
                                  const float *norm, float eps, float *const *y);
/* The fused gate + up + SwiGLU launch: y[t*n_rows + r] = silu(g) * u, g = b_gate[r] + dot(W_gate
 * row r, xn[t]), u = b_up[r] + dot(W_up row r, xn[t]); one type; biases may be NULL; xn as above. */
ei_status ei_cuda_op_matmul_glu(int32_t type, const void *w_gate, const void *w_up, int64_t n_rows, int64_t n_cols,
                                const float *x, int64_t n_tok, const float *b_gate, const float *b_up,
                                const float *norm, float eps, float *y);
/* out[t*ne0 ..] = dequantized row tokens[t] of a (ne1 x ne0) table of `type`. */
ei_status ei_cuda_op_embed(int32_t type, const void *table, int64_t ne0, int64_t ne1, const int32_t *tokens,
                           int64_t n_tok, float *out);
ei_status ei_cuda_op_rmsnorm(const float *x, const float *w, int64_t n_tok, int64_t n, float eps, float *out);
/* In place on x[t][head][head_dim] for n_heads heads, positions pos[t]; freqs may be NULL;
 * the rotated dimensions scaled by mscale (LongRoPE's attention factor). */
ei_status ei_cuda_op_rope(float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim, int32_t rope_dim,
                          int32_t neox, float theta, float freq_scale, const float *freqs, float mscale,
                          const int32_t *pos);
/* gate[i] = silu(gate[i]) * up[i]. */
ei_status ei_cuda_op_swiglu(float *gate, const float *up, int64_t n);
/* ids / vals [n_rows][k]: the top-k of each row of x [n_rows][n], as ei_cuda_topk. */
ei_status ei_cuda_op_topk(const float *x, int64_t n_rows, int64_t n, int32_t k, int32_t *ids, float *vals);
/* As ei_kernel_attention. */
ei_status ei_cuda_op_attention(const float *q, int32_t g, const uint16_t *k, const uint16_t *v,
                               const int32_t *cell_pos, int32_t n_cells, int32_t pos, int32_t hd, float *out);

/* ---- Qwen3 / Gemma 3 ops ---- */
/* As ei_cuda_op_attention with the query scale (0: 1/sqrt(hd)) and a window (0: none): cells with
 * pos - window < cell_pos, or cell_pos < keep_below (a sliding ring's sinks), are visible. */
ei_status ei_cuda_op_attention_window(const float *q, int32_t g, const uint16_t *k, const uint16_t *v,
                                      const int32_t *cell_pos, int32_t n_cells, int32_t pos, int32_t hd, float scale,
                                      int32_t window, int32_t keep_below, float *out);
/* gate[i] = gelu_tanh(gate[i]) * up[i]. */
ei_status ei_cuda_op_geglu(float *gate, const float *up, int64_t n);
/* RMSNorm of each head of x[t][head][head_dim] with weights w[head_dim], in place (the rope_store launch, no rotation). */
ei_status ei_cuda_op_head_norm(float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim, const float *w, float eps);
/* x[t*n ..] += rmsnorm(y[t*n ..]) * w (a post-norm into the residual). */
ei_status ei_cuda_op_rmsnorm_add(const float *y, const float *w, int64_t n_tok, int64_t n, float eps, float *x);
/* x[i] = cap * tanh(x[i] / cap). */
ei_status ei_cuda_op_softcap(float *x, int64_t n, float cap);
#ifdef __cplusplus
}
#endif
#endif
