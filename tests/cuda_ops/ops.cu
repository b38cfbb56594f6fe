/* Single ops on host arrays, for tests: each output lives in a device buffer
 * with guard bytes on both sides, checked after the kernel. */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.cuh"
#include "ops.h"

enum { GUARD = 256 };
static const unsigned char GUARD_BYTE = 0xA5;

/* A device buffer of n bytes (optionally filled from host) with GUARD bytes of
 * GUARD_BYTE before and after it. */
typedef struct {
    unsigned char *base;
    void *ptr;
    size_t n;
} gbuf;

static ei_status gb_alloc(gbuf *b, size_t n, const void *host) {
    b->n = n;
    b->ptr = NULL;
    ei_status st = eic_check(cudaMalloc((void **)&b->base, n + 2 * GUARD), "cudaMalloc");
    if (st != EI_OK) return st;
    b->ptr = b->base + GUARD;
    if ((st = eic_check(cudaMemset(b->base, GUARD_BYTE, n + 2 * GUARD), "cudaMemset")) != EI_OK) return st;
    if (host && n) st = eic_check(cudaMemcpy(b->ptr, host, n, cudaMemcpyHostToDevice), "upload");
    return st;
}

static void gb_free(gbuf *b) {
    if (b->base) cudaFree(b->base);
    b->base = NULL;
}

/* Copies the buffer back to host (when host is not NULL) and checks its guards. */
static ei_status gb_finish(gbuf *b, void *host, const char *what) {
    unsigned char *g = (unsigned char *)malloc(2 * GUARD);
    if (!g) return eic_fail(EI_ERR_OUT_OF_MEMORY, "out of host memory");
    ei_status st = eic_check(cudaMemcpy(g, b->base, GUARD, cudaMemcpyDeviceToHost), "guard download");
    if (st == EI_OK) st = eic_check(cudaMemcpy(g + GUARD, b->base + GUARD + b->n, GUARD, cudaMemcpyDeviceToHost), "guard download");
    if (st == EI_OK && host && b->n) st = eic_check(cudaMemcpy(host, b->ptr, b->n, cudaMemcpyDeviceToHost), "download");
    if (st == EI_OK)
        for (int i = 0; i < 2 * GUARD; i++)
            if (g[i] != GUARD_BYTE) {
                st = eic_fail(EI_ERR_STATE, "%s: guard byte %d %s the output overwritten", what,
                              i < GUARD ? GUARD - i : i - GUARD, i < GUARD ? "before" : "after");
                break;
            }
    free(g);
    return st;
}

static ei_status ready(void) {
    if (ei_cuda_device_count() < 0) return EI_ERR_UNSUPPORTED;
    return EI_OK;
}

#define TRY(x)                   \
    do {                         \
        if ((st = (x)) != EI_OK) \
            goto done;           \
    } while (0)

/* *bytes = the size of n_rows rows of type, or a failure naming `what`. */
static ei_status weight_bytes(const char *what, int32_t type, int64_t n_rows, int64_t n_cols, size_t *bytes) {
    int e, bb;
    if (!eic_type_block(type, &e, &bb)) return eic_fail(EI_ERR_UNSUPPORTED, "%s: type %d has no CUDA kernel", what, type);
    if (n_cols % e)
        return eic_fail(EI_ERR_INVALID_ARG, "%s: n_cols=%lld not a multiple of %d", what, (long long)n_cols, e);
    *bytes = (size_t)(n_cols / e * bb) * (size_t)n_rows;
    return EI_OK;
}

extern "C" ei_status ei_cuda_op_matmul(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, const float *x,
                                       int64_t n_tok, const float *bias, int32_t accumulate, float *y) {
    if (!w || !x || !y || n_rows < 1 || n_cols < 1 || n_tok < 1) return eic_fail(EI_ERR_INVALID_ARG, "op_matmul: bad arguments");
    size_t wb;
    ei_status st = weight_bytes("op_matmul", type, n_rows, n_cols, &wb);
    if (st != EI_OK || (st = ready()) != EI_OK) return st;
    gbuf gw = {}, gx = {}, gb = {}, gy = {};
    TRY(gb_alloc(&gw, wb, w));
    TRY(gb_alloc(&gx, (size_t)(n_tok * n_cols) * 4, x));
    if (bias) TRY(gb_alloc(&gb, (size_t)n_rows * 4, bias));
    TRY(gb_alloc(&gy, (size_t)(n_tok * n_rows) * 4, y));
    TRY(eic_check(eic_matmul(0, type, gw.ptr, n_rows, n_cols, (const float *)gx.ptr, n_cols, n_tok,
                             bias ? (const float *)gb.ptr : NULL, accumulate, (float *)gy.ptr, n_rows), "matmul"));
    TRY(eic_check(cudaDeviceSynchronize(), "matmul"));
    TRY(gb_finish(&gy, y, "matmul"));
    TRY(gb_finish(&gw, NULL, "matmul weights"));
    TRY(gb_finish(&gx, NULL, "matmul input"));
done:
    gb_free(&gw);
    gb_free(&gx);
    gb_free(&gb);
    gb_free(&gy);
    return st;
}

extern "C" ei_status ei_cuda_op_matmul_multi(int32_t type, int32_t n_parts, const void *const *w, const int64_t *n_rows,
                                             int64_t n_cols, const float *x, int64_t n_tok, const float *const *bias,
                                             const float *norm, float eps, float *const *y) {
    if (!w || !n_rows || !x || !y || n_parts < 1 || n_parts > EIC_MM_MAX_PARTS || n_cols < 1 || n_tok < 1)
        return eic_fail(EI_ERR_INVALID_ARG, "op_matmul_multi: bad arguments (1 <= n_parts <= %d)", EIC_MM_MAX_PARTS);
    size_t wb[EIC_MM_MAX_PARTS];
    ei_status st;
    for (int p = 0; p < n_parts; p++) {
        if (!w[p] || !y[p] || n_rows[p] < 1) return eic_fail(EI_ERR_INVALID_ARG, "op_matmul_multi: bad part %d", p);
        if ((st = weight_bytes("op_matmul_multi", type, n_rows[p], n_cols, &wb[p])) != EI_OK) return st;
    }
    if ((st = ready()) != EI_OK) return st;
    gbuf gw[EIC_MM_MAX_PARTS] = {}, gb[EIC_MM_MAX_PARTS] = {}, gy[EIC_MM_MAX_PARTS] = {}, gx = {}, gn = {};
    eic_mm_part parts[EIC_MM_MAX_PARTS] = {};
    TRY(gb_alloc(&gx, (size_t)(n_tok * n_cols) * 4, x));
    if (norm) TRY(gb_alloc(&gn, (size_t)n_cols * 4, norm));
    for (int p = 0; p < n_parts; p++) {
        TRY(gb_alloc(&gw[p], wb[p], w[p]));
        if (bias && bias[p]) TRY(gb_alloc(&gb[p], (size_t)n_rows[p] * 4, bias[p]));
        TRY(gb_alloc(&gy[p], (size_t)(n_tok * n_rows[p]) * 4, y[p]));
        parts[p] = {gw[p].ptr, bias && bias[p] ? (const float *)gb[p].ptr : NULL, (float *)gy[p].ptr, n_rows[p],
                    n_rows[p]};
    }
    TRY(eic_check(eic_matmul_multi(0, type, parts, n_parts, n_cols, (const float *)gx.ptr, n_cols, n_tok,
                                   norm ? (const float *)gn.ptr : NULL, eps, 0), "matmul_multi"));
    TRY(eic_check(cudaDeviceSynchronize(), "matmul_multi"));
    for (int p = 0; p < n_parts; p++) {
        TRY(gb_finish(&gy[p], y[p], "matmul_multi"));
        TRY(gb_finish(&gw[p], NULL, "matmul_multi weights"));
    }
    TRY(gb_finish(&gx, NULL, "matmul_multi input"));
done:
    for (int p = 0; p < EIC_MM_MAX_PARTS; p++) {
        gb_free(&gw[p]);
        gb_free(&gb[p]);
        gb_free(&gy[p]);
    }
    gb_free(&gx);
    gb_free(&gn);
    return st;
}

extern "C" ei_status ei_cuda_op_matmul_glu(int32_t type, const void *w_gate, const void *w_up, int64_t n_rows,
                                           int64_t n_cols, const float *x, int64_t n_tok, const float *b_gate,
                                           const float *b_up, const float *norm, float eps, float *y) {
    if (!w_gate || !w_up || !x || !y || n_rows < 1 || n_cols < 1 || n_tok < 1)
        return eic_fail(EI_ERR_INVALID_ARG, "op_matmul_glu: bad arguments");
    size_t wb;
    ei_status st = weight_bytes("op_matmul_glu", type, n_rows, n_cols, &wb);
    if (st != EI_OK || (st = ready()) != EI_OK) return st;
    gbuf gg = {}, gu = {}, gbg = {}, gbu = {}, gx = {}, gn = {}, gy = {};
    TRY(gb_alloc(&gg, wb, w_gate));
    TRY(gb_alloc(&gu, wb, w_up));
    if (b_gate) TRY(gb_alloc(&gbg, (size_t)n_rows * 4, b_gate));
    if (b_up) TRY(gb_alloc(&gbu, (size_t)n_rows * 4, b_up));
    TRY(gb_alloc(&gx, (size_t)(n_tok * n_cols) * 4, x));
    if (norm) TRY(gb_alloc(&gn, (size_t)n_cols * 4, norm));
    TRY(gb_alloc(&gy, (size_t)(n_tok * n_rows) * 4, y));
    TRY(eic_check(eic_matmul_glu(0, type, gg.ptr, b_gate ? (const float *)gbg.ptr : NULL, gu.ptr,
                                 b_up ? (const float *)gbu.ptr : NULL, n_rows, n_cols, (const float *)gx.ptr, n_cols,
                                 n_tok, norm ? (const float *)gn.ptr : NULL, eps, (float *)gy.ptr, n_rows),
                  "matmul_glu"));
    TRY(eic_check(cudaDeviceSynchronize(), "matmul_glu"));
    TRY(gb_finish(&gy, y, "matmul_glu"));
    TRY(gb_finish(&gg, NULL, "matmul_glu gate weights"));
    TRY(gb_finish(&gu, NULL, "matmul_glu up weights"));
    TRY(gb_finish(&gx, NULL, "matmul_glu input"));
done:
    gb_free(&gg);
    gb_free(&gu);
    gb_free(&gbg);
    gb_free(&gbu);
    gb_free(&gx);
    gb_free(&gn);
    gb_free(&gy);
    return st;
}

extern "C" ei_status ei_cuda_op_embed(int32_t type, const void *table, int64_t ne0, int64_t ne1, const int32_t *tokens,
                                      int64_t n_tok, float *out) {
    if (!table || !tokens || !out || ne0 < 1 || ne1 < 1 || n_tok < 1) return eic_fail(EI_ERR_INVALID_ARG, "op_embed: bad arguments");
    int e, bb;
    if (!eic_type_block(type, &e, &bb) || ne0 % e) return eic_fail(EI_ERR_UNSUPPORTED, "op_embed: type %d, ne0 %lld", type, (long long)ne0);
    for (int64_t t = 0; t < n_tok; t++)
        if (tokens[t] < 0 || tokens[t] >= ne1) return eic_fail(EI_ERR_RANGE, "op_embed: token %d outside [0, %lld)", tokens[t], (long long)ne1);
    ei_status st = ready();
    if (st != EI_OK) return st;
    gbuf gt = {}, gk = {}, go = {};
    TRY(gb_alloc(&gt, (size_t)(ne0 / e * bb) * (size_t)ne1, table));
    TRY(gb_alloc(&gk, (size_t)n_tok * 4, tokens));
    TRY(gb_alloc(&go, (size_t)(n_tok * ne0) * 4, NULL));
    TRY(eic_check(eic_embed(0, type, gt.ptr, ne0, (const int32_t *)gk.ptr, n_tok, (float *)go.ptr), "embed"));
    TRY(eic_check(cudaDeviceSynchronize(), "embed"));
    TRY(gb_finish(&go, out, "embed"));
done:
    gb_free(&gt);
    gb_free(&gk);
    gb_free(&go);
    return st;
}

extern "C" ei_status ei_cuda_op_rmsnorm(const float *x, const float *w, int64_t n_tok, int64_t n, float eps, float *out) {
    if (!x || !w || !out || n_tok < 1 || n < 1) return eic_fail(EI_ERR_INVALID_ARG, "op_rmsnorm: bad arguments");
    ei_status st = ready();
    if (st != EI_OK) return st;
    gbuf gx = {}, gw = {}, go = {};
    TRY(gb_alloc(&gx, (size_t)(n_tok * n) * 4, x));
    TRY(gb_alloc(&gw, (size_t)n * 4, w));
    TRY(gb_alloc(&go, (size_t)(n_tok * n) * 4, NULL));
    TRY(eic_check(eic_rmsnorm(0, (const float *)gx.ptr, (const float *)gw.ptr, NULL, n_tok, n, eps, (float *)go.ptr), "rmsnorm"));
    TRY(eic_check(cudaDeviceSynchronize(), "rmsnorm"));
    TRY(gb_finish(&go, out, "rmsnorm"));
done:
    gb_free(&gx);
    gb_free(&gw);
    gb_free(&go);
    return st;
}

extern "C" ei_status ei_cuda_op_rope(float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim, int32_t rope_dim,
                                     int32_t neox, float theta, float freq_scale, const float *freqs, float mscale,
                                     const int32_t *pos) {
    if (!x || !pos || n_tok < 1 || n_heads < 1 || head_dim < 2 || rope_dim < 0 || rope_dim > head_dim || rope_dim % 2)
        return eic_fail(EI_ERR_INVALID_ARG, "op_rope: bad arguments");
    ei_status st = ready();
    if (st != EI_OK) return st;
    const size_t half = rope_dim / 2 ? rope_dim / 2 : 1;
    gbuf gx = {}, gp = {}, gf = {}, gc = {}, gs = {};
    TRY(gb_alloc(&gx, (size_t)(n_tok * n_heads * head_dim) * 4, x));
    TRY(gb_alloc(&gp, (size_t)n_tok * 4, pos));
    if (freqs) TRY(gb_alloc(&gf, half * 4, freqs));
    TRY(gb_alloc(&gc, (size_t)n_tok * half * 4, NULL));
    TRY(gb_alloc(&gs, (size_t)n_tok * half * 4, NULL));
    TRY(eic_check(eic_rope_tables(0, (const int32_t *)gp.ptr, n_tok, rope_dim, theta, freq_scale,
                                  freqs ? (const float *)gf.ptr : NULL, mscale, (float *)gc.ptr, (float *)gs.ptr, NULL, NULL,
                                  NULL, 0), "rope tables"));
    TRY(eic_check(eic_rope_store(0, (float *)gx.ptr, NULL, NULL, n_tok, n_heads, 0, head_dim, rope_dim, neox,
                                 (const float *)gc.ptr, (const float *)gs.ptr, NULL, 0, NULL, NULL, NULL), "rope"));
    TRY(eic_check(cudaDeviceSynchronize(), "rope"));
    TRY(gb_finish(&gx, x, "rope"));
    TRY(gb_finish(&gc, NULL, "rope cos"));
    TRY(gb_finish(&gs, NULL, "rope sin"));
done:
    gb_free(&gx);
    gb_free(&gp);
    gb_free(&gf);
    gb_free(&gc);
    gb_free(&gs);
    return st;
}

extern "C" ei_status ei_cuda_op_swiglu(float *gate, const float *up, int64_t n) {
    if (!gate || !up || n < 1) return eic_fail(EI_ERR_INVALID_ARG, "op_swiglu: bad arguments");
    ei_status st = ready();
    if (st != EI_OK) return st;
    gbuf gg = {}, gu = {};
    TRY(gb_alloc(&gg, (size_t)n * 4, gate));
    TRY(gb_alloc(&gu, (size_t)n * 4, up));
    TRY(eic_check(eic_swiglu(0, (float *)gg.ptr, (const float *)gu.ptr, n), "swiglu"));
    TRY(eic_check(cudaDeviceSynchronize(), "swiglu"));
    TRY(gb_finish(&gg, gate, "swiglu"));
done:
    gb_free(&gg);
    gb_free(&gu);
    return st;
}

extern "C" ei_status ei_cuda_op_topk(const float *x, int64_t n_rows, int64_t n, int32_t k, int32_t *ids, float *vals) {
    if (!x || !ids || !vals || n_rows < 1 || n < 1 || n > INT32_MAX) return eic_fail(EI_ERR_INVALID_ARG, "op_topk: bad arguments");
    if (k < 1 || k > EIC_TOPK_MAX || k > n)
        return eic_fail(EI_ERR_RANGE, "op_topk: k=%d outside [1, min(n=%lld, %d)]", k, (long long)n, EIC_TOPK_MAX);
    ei_status st = ready();
    if (st != EI_OK) return st;
    gbuf gx = {}, gi = {}, gv = {};
    TRY(gb_alloc(&gx, (size_t)(n_rows * n) * 4, x));
    TRY(gb_alloc(&gi, (size_t)(n_rows * k) * 4, NULL));
    TRY(gb_alloc(&gv, (size_t)(n_rows * k) * 4, NULL));
    TRY(eic_check(eic_topk(0, (const float *)gx.ptr, n_rows, n, k, (int32_t *)gi.ptr, (float *)gv.ptr), "topk"));
    TRY(eic_check(cudaDeviceSynchronize(), "topk"));
    TRY(gb_finish(&gi, ids, "topk ids"));
    TRY(gb_finish(&gv, vals, "topk vals"));
done:
    gb_free(&gx);
    gb_free(&gi);
    gb_free(&gv);
    return st;
}

extern "C" ei_status ei_cuda_op_attention(const float *q, int32_t g, const uint16_t *k, const uint16_t *v,
                                          const int32_t *cell_pos, int32_t n_cells, int32_t pos, int32_t hd, float *out) {
    return ei_cuda_op_attention_window(q, g, k, v, cell_pos, n_cells, pos, hd, 0.0f, 0, 0, out);
}

extern "C" ei_status ei_cuda_op_attention_window(const float *q, int32_t g, const uint16_t *k, const uint16_t *v,
                                                 const int32_t *cell_pos, int32_t n_cells, int32_t pos, int32_t hd,
                                                 float scale, int32_t window, int32_t keep_below, float *out) {
    if (!q || !k || !v || !cell_pos || !out || g < 1 || g > EIC_MAX_GROUP || n_cells < 1 || hd < 1 || hd > EIC_MAX_HEAD_DIM)
        return eic_fail(EI_ERR_INVALID_ARG, "op_attention: bad arguments (g <= %d, hd <= %d)", EIC_MAX_GROUP, EIC_MAX_HEAD_DIM);
    ei_status st = ready();
    if (st != EI_OK) return st;
    const int n_chunks = (n_cells + EIC_ATTN_CHUNK - 1) / EIC_ATTN_CHUNK;
    const int32_t meta[3] = {0, pos, n_cells};   /* slot, pos, n_cells of the one token */
    gbuf gq = {}, gk = {}, gv = {}, gc = {}, gm = {}, gp = {}, go = {};
    eic_kv kv = {};
    TRY(gb_alloc(&gq, (size_t)g * hd * 4, q));
    TRY(gb_alloc(&gk, (size_t)n_cells * hd * 2, k));
    TRY(gb_alloc(&gv, (size_t)n_cells * hd * 2, v));
    TRY(gb_alloc(&gc, (size_t)n_cells * 4, cell_pos));
    TRY(gb_alloc(&gm, sizeof meta, meta));
    TRY(gb_alloc(&gp, (size_t)n_chunks * g * EIC_PART_FLOATS(hd) * 4, NULL));
    TRY(gb_alloc(&go, (size_t)g * hd * 4, NULL));
    kv.k = (uint16_t *)gk.ptr;
    kv.v = (uint16_t *)gv.ptr;
    kv.n_layer = 1;
    kv.n_head_kv = 1;
    kv.n_ctx = n_cells;
    kv.hd = hd;
    {
        const int32_t *m = (const int32_t *)gm.ptr;
        TRY(eic_check(eic_attention(0, (const float *)gq.ptr, 1, g, &kv, 0, m, m + 1, m + 2, (const int32_t *)gc.ptr,
                                    n_chunks, (float *)gp.ptr, (float *)go.ptr, scale, window, keep_below), "attention"));
    }
    TRY(eic_check(cudaDeviceSynchronize(), "attention"));
    TRY(gb_finish(&go, out, "attention"));
    TRY(gb_finish(&gp, NULL, "attention partials"));
done:
    gb_free(&gq);
    gb_free(&gk);
    gb_free(&gv);
    gb_free(&gc);
    gb_free(&gm);
    gb_free(&gp);
    gb_free(&go);
    return st;
}

/* ---- Qwen3 / Gemma 3 ops ---- */
extern "C" ei_status ei_cuda_op_geglu(float *gate, const float *up, int64_t n) {
    if (!gate || !up || n < 1) return eic_fail(EI_ERR_INVALID_ARG, "op_geglu: bad arguments");
    ei_status st = ready();
    if (st != EI_OK) return st;
    gbuf gg = {}, gu = {};
    TRY(gb_alloc(&gg, (size_t)n * 4, gate));
    TRY(gb_alloc(&gu, (size_t)n * 4, up));
    TRY(eic_check(eic_geglu(0, (float *)gg.ptr, (const float *)gu.ptr, n), "geglu"));
    TRY(eic_check(cudaDeviceSynchronize(), "geglu"));
    TRY(gb_finish(&gg, gate, "geglu"));
done:
    gb_free(&gg);
    gb_free(&gu);
    return st;
}

extern "C" ei_status ei_cuda_op_head_norm(float *x, int64_t n_tok, int32_t n_heads, int32_t head_dim, const float *w,
                                          float eps) {
    if (!x || !w || n_tok < 1 || n_heads < 1 || head_dim < 2) return eic_fail(EI_ERR_INVALID_ARG, "op_head_norm: bad arguments");
    ei_status st = ready();
    if (st != EI_OK) return st;
    gbuf gx = {}, gw = {}, gt = {};
    TRY(gb_alloc(&gx, (size_t)(n_tok * n_heads * head_dim) * 4, x));
    TRY(gb_alloc(&gw, (size_t)head_dim * 4, w));
    TRY(gb_alloc(&gt, 4, NULL));
    {
        const eic_qk_norm qkn = {(const float *)gw.ptr, NULL, eps};
        TRY(eic_check(eic_rope_store(0, (float *)gx.ptr, NULL, NULL, n_tok, n_heads, 0, head_dim, 0, 1,
                                     (const float *)gt.ptr, (const float *)gt.ptr, NULL, 0, NULL, NULL, &qkn),
                      "head_norm"));
    }
    TRY(eic_check(cudaDeviceSynchronize(), "head_norm"));
    TRY(gb_finish(&gx, x, "head_norm"));
done:
    gb_free(&gx);
    gb_free(&gw);
    gb_free(&gt);
    return st;
}

extern "C" ei_status ei_cuda_op_rmsnorm_add(const float *y, const float *w, int64_t n_tok, int64_t n, float eps, float *x) {
    if (!x || !y || !w || n_tok < 1 || n < 1) return eic_fail(EI_ERR_INVALID_ARG, "op_rmsnorm_add: bad arguments");
    ei_status st = ready();
    if (st != EI_OK) return st;
    gbuf gy = {}, gw = {}, gx = {};
    TRY(gb_alloc(&gy, (size_t)(n_tok * n) * 4, y));
    TRY(gb_alloc(&gw, (size_t)n * 4, w));
    TRY(gb_alloc(&gx, (size_t)(n_tok * n) * 4, x));
    TRY(eic_check(eic_rmsnorm_add(0, (const float *)gy.ptr, (const float *)gw.ptr, n_tok, n, eps, (float *)gx.ptr),
                  "rmsnorm_add"));
    TRY(eic_check(cudaDeviceSynchronize(), "rmsnorm_add"));
    TRY(gb_finish(&gx, x, "rmsnorm_add"));
done:
    gb_free(&gy);
    gb_free(&gw);
    gb_free(&gx);
    return st;
}

extern "C" ei_status ei_cuda_op_softcap(float *x, int64_t n, float cap) {
    if (!x || n < 1 || !(cap > 0)) return eic_fail(EI_ERR_INVALID_ARG, "op_softcap: bad arguments");
    ei_status st = ready();
    if (st != EI_OK) return st;
    gbuf gx = {};
    TRY(gb_alloc(&gx, (size_t)n * 4, x));
    TRY(eic_check(eic_softcap(0, (float *)gx.ptr, n, cap), "softcap"));
    TRY(eic_check(cudaDeviceSynchronize(), "softcap"));
    TRY(gb_finish(&gx, x, "softcap"));
done:
    gb_free(&gx);
    return st;
}
