/* The Gated DeltaNet kernels' bodies (deltanet.h), written once over four vector primitives
 * that deltanet.c defines per ISA before each inclusion:
 *   axpy(n, a, x, y): y += a x     scale(n, a, y): y *= a     dot(n, x, y): sum x y
 *   gate_rows(n, r, x, w, g): x = x r w silu(g)
 * and SFX (the name suffix) and TGT (the target attribute). No include guard: included once per ISA. */
#define DN_CAT2(a, b) a##_##b
#define DN_CAT(a, b) DN_CAT2(a, b)
#define DN(name) DN_CAT(name, SFX)

/* S = exp(g) S;  delta = beta (v - S^T k);  S += k delta^T;  o = S^T q. */
TGT void DN(ei_delta_step)(const ei_delta_head *a, int chunk, float *scratch) {
    (void)chunk;
    const int dk = a->dk, dv = a->dv;
    float *S = a->state, *delta = scratch;
    for (int64_t t = 0; t < a->n_tok; t++) {
        const float *q = a->q + t * a->ld_qk, *k = a->k + t * a->ld_qk, *v = a->v + t * a->ld_v;
        float *o = a->o + t * a->ld_o;
        const float decay = expf(a->g[t * a->ld_gb]), beta = a->beta[t * a->ld_gb];
        memset(delta, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) {
            DN(scale)(dv, decay, S + (int64_t)i * dv);
            DN(axpy)(dv, k[i], S + (int64_t)i * dv, delta);
        }
        DN(scale)(dv, -beta, delta);
        DN(axpy)(dv, beta, v, delta);
        memset(o, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) {
            DN(axpy)(dv, k[i], delta, S + (int64_t)i * dv);
            DN(axpy)(dv, q[i], S + (int64_t)i * dv, o);
        }
    }
}

/* Chunks of C tokens (edgeinfer/arch/deltanet.py, chunked_gated_delta_rule): with c_i the
 * cumulative log decay in the chunk and S0 the state before it,
 *   u_i = beta_i (v_i - exp(c_i) S0^T k_i) - sum_{j<i} beta_i exp(c_i - c_j) (k_i.k_j) u_j
 *   o_i = exp(c_i) S0^T q_i + sum_{j<=i} exp(c_i - c_j) (q_i.k_j) u_j
 *   S   = exp(c_last) S0 + sum_j exp(c_last - c_j) k_j u_j^T
 * Every exponent is <= 0 (g <= 0), so nothing overflows. scratch: u [C][dv], then c [C]. */
TGT void DN(ei_delta_chunked)(const ei_delta_head *a, int chunk, float *scratch) {
    const int dk = a->dk, dv = a->dv;
    float *S = a->state, *u = scratch, *c = scratch + (int64_t)chunk * dv;
    for (int64_t c0 = 0; c0 < a->n_tok; c0 += chunk) {
        const int m = (int)(a->n_tok - c0 < chunk ? a->n_tok - c0 : chunk);
        const float *q0 = a->q + c0 * a->ld_qk, *k0 = a->k + c0 * a->ld_qk;
        float acc = 0.0f;
        for (int i = 0; i < m; i++) c[i] = acc += a->g[(c0 + i) * a->ld_gb];
        /* u_i = beta_i v_i - beta_i exp(c_i) S0^T k_i;  o_i = exp(c_i) S0^T q_i (row p of S0 read once) */
        memset(u, 0, (size_t)m * dv * sizeof(float));
        for (int i = 0; i < m; i++) memset(a->o + (c0 + i) * a->ld_o, 0, (size_t)dv * sizeof(float));
        for (int p = 0; p < dk; p++)
            for (int i = 0; i < m; i++) {
                DN(axpy)(dv, k0[i * a->ld_qk + p], S + (int64_t)p * dv, u + (int64_t)i * dv);
                DN(axpy)(dv, q0[i * a->ld_qk + p], S + (int64_t)p * dv, a->o + (c0 + i) * a->ld_o);
            }
        for (int i = 0; i < m; i++) {
            const float beta = a->beta[(c0 + i) * a->ld_gb], e = expf(c[i]);
            float *ui = u + (int64_t)i * dv, *oi = a->o + (c0 + i) * a->ld_o;
            const float *ki = k0 + i * a->ld_qk, *qi = q0 + i * a->ld_qk;
            DN(scale)(dv, -beta * e, ui);
            DN(axpy)(dv, beta, a->v + (c0 + i) * a->ld_v, ui);
            for (int j = 0; j < i; j++)   /* forward substitution: u_j is final */
                DN(axpy)(dv, -beta * expf(c[i] - c[j]) * DN(dot)(dk, ki, k0 + j * a->ld_qk), u + (int64_t)j * dv, ui);
            DN(scale)(dv, e, oi);
            for (int j = 0; j <= i; j++)
                DN(axpy)(dv, expf(c[i] - c[j]) * DN(dot)(dk, qi, k0 + j * a->ld_qk), u + (int64_t)j * dv, oi);
        }
        const float last = c[m - 1];
        for (int j = 0; j < m; j++) c[j] = expf(last - c[j]);
        for (int p = 0; p < dk; p++) {
            float *Sp = S + (int64_t)p * dv;
            DN(scale)(dv, expf(last), Sp);
            for (int j = 0; j < m; j++) DN(axpy)(dv, c[j] * k0[j * a->ld_qk + p], u + (int64_t)j * dv, Sp);
        }
    }
}

TGT void DN(ei_l2norm)(float *x, int64_t n_rows, int64_t d, float eps, float scale) {
    for (int64_t r = 0; r < n_rows; r++) {
        float *xr = x + r * d;
        DN(scale)(d, scale / sqrtf(DN(dot)(d, xr, xr) + eps), xr);
    }
}

TGT void DN(ei_gated_norm)(float *x, const float *w, const float *gate, int64_t n_rows, int64_t d, float eps) {
    for (int64_t r = 0; r < n_rows; r++) {
        float *xr = x + r * d;
        DN(gate_rows)(d, 1.0f / sqrtf(DN(dot)(d, xr, xr) / (float)d + eps), xr, w, gate + r * d);
    }
}

#undef DN
#undef DN_CAT
#undef DN_CAT2
