/* Qwen3.5's Gated DeltaNet kernels (deltanet.c): the gated delta rule per value head, token by
 * token or by chunks (the UT transform), and the row norms around it. The scalar table's
 * kernels are the references of the SIMD ones. */
#ifndef EI_DELTANET_H
#define EI_DELTANET_H
#include <stdint.h>

/* One value head over n_tok tokens. Token t reads q + t * ld_qk, k + t * ld_qk (dk floats,
 * q already scaled), v + t * ld_v (dv floats), g[t * ld_gb] (the log decay, <= 0) and
 * beta[t * ld_gb]; writes o + t * ld_o (dv floats); state is the head's [dk][dv] matrix. */
typedef struct {
    const float *q, *k, *v, *g, *beta;
    float *o, *state;
    int64_t ld_qk, ld_v, ld_gb, ld_o, n_tok;
    int dk, dv;
} ei_delta_head;

/* chunk: tokens per chunk (the chunked form; ignored token by token); scratch holds
 * ei_delta_scratch_floats(chunk, dk, dv) floats. */
typedef void (*ei_delta_fn)(const ei_delta_head *a, int chunk, float *scratch);
/* The chunked form's row length of its chunk x chunk products and of K^T: whole vectors of every ISA. */
static inline int64_t ei_delta_chunk_pad(int chunk) { return ((int64_t)(chunk > 1 ? chunk : 1) + 15) / 16 * 16; }
/* u [chunk][dv]; c, w [pad]; K^T [dk][pad]; one chunk x chunk product [chunk][pad] (>= dv for the step) */
static inline int64_t ei_delta_scratch_floats(int chunk, int dk, int dv) {
    const int64_t m = chunk > 1 ? chunk : 1, pad = ei_delta_chunk_pad(chunk);
    return m * dv + pad * (2 + dk + m);
}

/* x[r] = x[r] * scale / sqrt(sum x[r]^2 + eps) for n_rows rows of d floats. */
typedef void (*ei_l2norm_fn)(float *x, int64_t n_rows, int64_t d, float eps, float scale);
/* x[r] = x[r] / sqrt(mean x[r]^2 + eps) * w * silu(gate[r]), rows of d floats. */
typedef void (*ei_gated_norm_fn)(float *x, const float *w, const float *gate, int64_t n_rows, int64_t d, float eps);

#define EI_DELTANET_DECL(sfx)                                                                         \
    void ei_delta_step_##sfx(const ei_delta_head *a, int chunk, float *scratch);                     \
    void ei_delta_chunked_##sfx(const ei_delta_head *a, int chunk, float *scratch);                  \
    void ei_l2norm_##sfx(float *x, int64_t n_rows, int64_t d, float eps, float scale);                \
    void ei_gated_norm_##sfx(float *x, const float *w, const float *gate, int64_t n_rows, int64_t d, float eps);
EI_DELTANET_DECL(scalar)
#if defined(__x86_64__)
EI_DELTANET_DECL(avx2)
EI_DELTANET_DECL(avx512)
#endif
#if defined(__aarch64__)
EI_DELTANET_DECL(neon)
#endif
#endif
