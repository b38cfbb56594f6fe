/* Placeholder: the lead replaces this with the model, runtime and forward pass. */
#include "common.h"
#include "kernels.h"

ei_status ei_kernel_matmul(int type, int isa, const void *w, int64_t n_rows, int64_t n_cols,
                           const float *x, int64_t n_tok, float *y, int n_threads) {
    (void)type; (void)isa; (void)w; (void)n_rows; (void)n_cols; (void)x; (void)n_tok; (void)y; (void)n_threads;
    return ei_fail(EI_ERR_UNSUPPORTED, "not yet");
}
ei_status ei_model_create(const ei_model_config *cfg, ei_model **out) { (void)cfg; (void)out; return EI_ERR_UNSUPPORTED; }
ei_status ei_model_set_tensor(ei_model *m, int layer, int role, const void *data, int type, int64_t ne0, int64_t ne1) {
    (void)m; (void)layer; (void)role; (void)data; (void)type; (void)ne0; (void)ne1; return EI_ERR_UNSUPPORTED; }
ei_status ei_model_finalize(ei_model *m) { (void)m; return EI_ERR_UNSUPPORTED; }
void ei_model_free(ei_model *m) { (void)m; }
ei_status ei_runtime_create(const ei_model *m, const ei_runtime_params *p, ei_runtime **out) { (void)m; (void)p; (void)out; return EI_ERR_UNSUPPORTED; }
void ei_runtime_free(ei_runtime *rt) { (void)rt; }
size_t ei_runtime_kv_bytes(const ei_runtime *rt) { (void)rt; return 0; }
size_t ei_runtime_scratch_bytes(const ei_runtime *rt) { (void)rt; return 0; }
ei_status ei_runtime_clear_slot(ei_runtime *rt, int slot) { (void)rt; (void)slot; return EI_ERR_UNSUPPORTED; }
ei_status ei_runtime_forget_from(ei_runtime *rt, int slot, int32_t pos) { (void)rt; (void)slot; (void)pos; return EI_ERR_UNSUPPORTED; }
ei_status ei_forward(ei_runtime *rt, int32_t n_tokens, const int32_t *tokens, const int32_t *slots, const int32_t *pos,
                     const int32_t *cells, int32_t n_out, const int32_t *out_rows, float *logits) {
    (void)rt; (void)n_tokens; (void)tokens; (void)slots; (void)pos; (void)cells; (void)n_out; (void)out_rows; (void)logits;
    return EI_ERR_UNSUPPORTED; }
/* Kernel stubs until native/src/quants*.c land. */
int ei_cpu_best_isa(void) { return 0; }
int ei_isa_supported(int isa) { return isa == 0; }
const char *ei_isa_name(int isa) { (void)isa; return "scalar"; }
ei_status ei_type_block(int type, int32_t *be, int32_t *bb) { (void)type; (void)be; (void)bb; return EI_ERR_UNSUPPORTED; }
ei_status ei_kernel_dequantize(int type, int isa, const void *src, float *dst, int64_t n) { (void)type; (void)isa; (void)src; (void)dst; (void)n; return EI_ERR_UNSUPPORTED; }
ei_status ei_kernel_dot(int type, int isa, int64_t n, const void *row, const float *x, float *out) { (void)type; (void)isa; (void)n; (void)row; (void)x; (void)out; return EI_ERR_UNSUPPORTED; }
