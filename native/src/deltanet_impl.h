/* The Gated DeltaNet kernels' bodies (deltanet.h), written once over four vector primitives
 * (and two for the chunked form's products) that deltanet.c defines per ISA before each inclusion:
 *   axpy(n, a, x, y): y += a x     scale(n, a, y): y *= a     dot(n, x, y): sum x y
 *   gate_rows(n, r, x, w, g): x = x r w silu(g)
 *   decay(n, ci, c, s, x): x[j] *= s exp(ci - c[j])
 *   gemm(M, N, K, A, sa, sp, B, ldb, C, ldc, acc): C (+)= A B, a(i, p) = A[i sa + p sp] (deltanet_gemm.h)
 * and SFX (the name suffix) and TGT (the target attribute), undefined at its end. No include guard:
 * included once per ISA. */
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
 * as small matrix products (gemm): U = K S0 and O = Q S0 [m x dk][dk x dv], the m x m K K^T and
 * Q K^T (by blocks of DN_BLOCK rows, lower triangle only), the forward substitution by blocks
 * (the rows before a block in one product, then the block's own rows), O += P U, and
 * S = e S0 + K^T (w U) [dk x m][m x dv]. Every exponent is <= 0 (g <= 0), so nothing overflows.
 * scratch (deltanet.h): u [C][dv], c [pad], w [pad], K^T [dk][pad] (zero past m), A [C][pad]. */
#ifndef DN_BLOCK
#define DN_BLOCK 16
#endif
TGT void DN(ei_delta_chunked)(const ei_delta_head *a, int chunk, float *scratch) {
    const int dk = a->dk, dv = a->dv;
    const int64_t pad = ei_delta_chunk_pad(chunk), ld = a->ld_qk, ldo = a->ld_o;
    float *S = a->state, *u = scratch, *c = u + (int64_t)chunk * dv, *w = c + pad, *kt = w + pad;
    float *am = kt + (int64_t)dk * pad;
    for (int64_t c0 = 0; c0 < a->n_tok; c0 += chunk) {
        const int m = (int)(a->n_tok - c0 < chunk ? a->n_tok - c0 : chunk);
        const float *q0 = a->q + c0 * ld, *k0 = a->k + c0 * ld, *g0 = a->g + c0 * a->ld_gb, *b0 = a->beta + c0 * a->ld_gb;
        float *o0 = a->o + c0 * ldo;
        float acc = 0.0f;
        for (int i = 0; i < m; i++) c[i] = acc += g0[i * a->ld_gb];
        for (int j0 = 0; j0 < pad; j0 += 8)   /* K^T (pad is whole 16s): 8 rows of k read along at once */
            for (int p = 0; p < dk; p++)
                for (int j = j0; j < j0 + 8; j++) kt[p * pad + j] = j < m ? k0[j * ld + p] : 0.0f;
        /* u_i = beta_i v_i - beta_i exp(c_i) S0^T k_i;  o_i = exp(c_i) S0^T q_i */
        DN(gemm)(m, dv, dk, k0, ld, 1, S, dv, u, dv, 0);
        DN(gemm)(m, dv, dk, q0, ld, 1, S, dv, o0, ldo, 0);
        for (int i = 0; i < m; i++) {
            const float beta = b0[i * a->ld_gb], e = expf(c[i]);
            DN(scale)(dv, -beta * e, u + (int64_t)i * dv);
            DN(axpy)(dv, beta, a->v + (c0 + i) * a->ld_v, u + (int64_t)i * dv);
            DN(scale)(dv, e, o0 + i * ldo);
        }
        /* forward substitution: A_ij = -beta_i exp(c_i - c_j) (k_i.k_j), j < i; u_i += sum_j A_ij u_j */
        for (int i0 = 0; i0 < m; i0 += DN_BLOCK) {
            const int r = m - i0 < DN_BLOCK ? m - i0 : DN_BLOCK;
            const int64_t ncol = (i0 + r + 15) / 16 * 16 < pad ? (i0 + r + 15) / 16 * 16 : pad;
            float *ab = am + (int64_t)i0 * pad, *ub = u + (int64_t)i0 * dv;
            DN(gemm)(r, ncol, dk, k0 + i0 * ld, ld, 1, kt, pad, ab, pad, 0);
            for (int i = i0; i < i0 + r; i++) DN(decay)(i, c[i], c, -b0[i * a->ld_gb], am + (int64_t)i * pad);
            if (i0) DN(gemm)(r, dv, i0, ab, pad, 1, u, dv, ub, dv, 1);
            for (int i = i0 + 1; i < i0 + r; i++)   /* the block's own earlier rows, final by now */
                for (int j = i0; j < i; j++) DN(axpy)(dv, am[(int64_t)i * pad + j], u + (int64_t)j * dv, u + (int64_t)i * dv);
        }
        /* o_i += sum_{j<=i} P_ij u_j, P_ij = exp(c_i - c_j) (q_i.k_j) (0 for j > i) */
        for (int i0 = 0; i0 < m; i0 += DN_BLOCK) {
            const int r = m - i0 < DN_BLOCK ? m - i0 : DN_BLOCK;
            const int64_t ncol = (i0 + r + 15) / 16 * 16 < pad ? (i0 + r + 15) / 16 * 16 : pad;
            float *pb = am + (int64_t)i0 * pad;
            DN(gemm)(r, ncol, dk, q0 + i0 * ld, ld, 1, kt, pad, pb, pad, 0);
            for (int i = i0; i < i0 + r; i++) {
                float *pi = am + (int64_t)i * pad;
                DN(decay)(i + 1, c[i], c, 1.0f, pi);
                for (int j = i + 1; j < i0 + r; j++) pi[j] = 0.0f;
            }
            DN(gemm)(r, dv, i0 + r, pb, pad, 1, u, dv, o0 + i0 * ldo, ldo, 1);
        }
        /* S = exp(c_last) S0 + K^T (w U), w_j = exp(c_last - c_j) */
        const float last = c[m - 1];
        for (int j = 0; j < m; j++) w[j] = 1.0f;
        DN(decay)(m, last, c, 1.0f, w);
        for (int j = 0; j < m; j++) DN(scale)(dv, w[j], u + (int64_t)j * dv);
        DN(scale)((int64_t)dk * dv, expf(last), S);
        DN(gemm)(dk, dv, m, kt, pad, 1, u, dv, S, dv, 1);
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
#undef SFX
#undef TGT
