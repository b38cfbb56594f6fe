/* The chunked delta rule's small matrix products (deltanet_impl.h's gemm primitive), written once
 * over one ISA's vector type, which deltanet.c defines before each inclusion:
 *   VT, VW (lanes), VLD(p), VST(p, x), VSET1(a), VZERO(), VFMA(a, b, c) = a b + c,
 *   GEMM_MR x GEMM_NV: the register tile (rows x vectors of C), and SFX, TGT.
 *   C[i][j] (+)= sum_p A[i sa + p sp] B[p ldb + j]    (i < M, j < N, p < K)
 * A tile of C stays in registers while p runs: per p, NV vector loads of B's row and, per row,
 * one broadcast of A and NV FMAs. Each C element sums over p in order, as the scalar loop does.
 * No include guard: included once per ISA; it undefines the vector primitives at its end. */
#define DG_CAT2(a, b) a##_##b
#define DG_CAT(a, b) DG_CAT2(a, b)
#define DG(name) DG_CAT(name, SFX)
_Static_assert(GEMM_MR <= 8 && GEMM_NV <= 4, "gemm_rows / gemm handle remainders up to these");

/* mr x nv (compile-time constants after inlining: the unrolled arrays live in registers) */
static inline __attribute__((always_inline)) TGT void DG(gemm_tile)(const int mr, const int nv, int64_t K,
                                                                     const float *A, int64_t sa, int64_t sp,
                                                                     const float *B, int64_t ldb, float *C,
                                                                     int64_t ldc, int acc) {
    VT c[GEMM_MR][GEMM_NV];
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 16
        for (int v = 0; v < nv; v++) c[r][v] = acc ? VLD(C + r * ldc + v * VW) : VZERO();
    for (int64_t p = 0; p < K; p++) {
        VT b[GEMM_NV];
        const float *Ap = A + p * sp;
#pragma GCC unroll 16
        for (int v = 0; v < nv; v++) b[v] = VLD(B + p * ldb + v * VW);
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            const VT ar = VSET1(Ap[r * sa]);
#pragma GCC unroll 16
            for (int v = 0; v < nv; v++) c[r][v] = VFMA(ar, b[v], c[r][v]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 16
        for (int v = 0; v < nv; v++) VST(C + r * ldc + v * VW, c[r][v]);
}

/* All M rows of nv vector columns: full tiles, then the last M % MR rows. */
static inline __attribute__((always_inline)) TGT void DG(gemm_rows)(const int nv, int64_t M, int64_t K,
                                                                     const float *A, int64_t sa, int64_t sp,
                                                                     const float *B, int64_t ldb, float *C,
                                                                     int64_t ldc, int acc) {
    int64_t i = 0;
    for (; i + GEMM_MR <= M; i += GEMM_MR) DG(gemm_tile)(GEMM_MR, nv, K, A + i * sa, sa, sp, B, ldb, C + i * ldc, ldc, acc);
    A += i * sa, C += i * ldc;
    switch (M - i) {   /* one specialised tile per remainder */
#define DG_REM(r) case r: if (r < GEMM_MR) DG(gemm_tile)(r < GEMM_MR ? r : 1, nv, K, A, sa, sp, B, ldb, C, ldc, acc); break;
        DG_REM(1) DG_REM(2) DG_REM(3) DG_REM(4) DG_REM(5) DG_REM(6) DG_REM(7)
#undef DG_REM
    default: break;
    }
}

static TGT void DG(gemm)(int64_t M, int64_t N, int64_t K, const float *A, int64_t sa, int64_t sp, const float *B,
                         int64_t ldb, float *C, int64_t ldc, int acc) {
    int64_t j = 0;
    for (; j + GEMM_NV * VW <= N; j += GEMM_NV * VW) DG(gemm_rows)(GEMM_NV, M, K, A, sa, sp, B + j, ldb, C + j, ldc, acc);
    switch ((N - j) / VW) {   /* the last whole vectors, one tile width */
#define DG_VREM(v) case v: if (v < GEMM_NV) DG(gemm_rows)(v < GEMM_NV ? v : 1, M, K, A, sa, sp, B + j, ldb, C + j, ldc, acc); break;
        DG_VREM(1) DG_VREM(2) DG_VREM(3)
#undef DG_VREM
    default: break;
    }
    for (j += (N - j) / VW * VW; j < N; j++)   /* columns past the last whole vector */
        for (int64_t i = 0; i < M; i++) {
            float s = acc ? C[i * ldc + j] : 0.0f;
            for (int64_t p = 0; p < K; p++) s += A[i * sa + p * sp] * B[p * ldb + j];
            C[i * ldc + j] = s;
        }
}

#undef DG
#undef DG_CAT
#undef DG_CAT2
/* the ISA's vector primitives and tile shape were this header's alone */
#undef VT
#undef VW
#undef VLD
#undef VST
#undef VSET1
#undef VZERO
#undef VFMA
#undef GEMM_MR
#undef GEMM_NV
