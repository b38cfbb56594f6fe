/* Packed K-quant kernels for one x86 level; packed_k.c includes this twice with
 * KT (target attribute), KSFX (name suffix) and KVNNI (1: vpdpbusd, 0: maddubs +
 * madd in exact int16 runs, packed_dot.h) defined. The integer part is exact either way,
 * so both levels give identical results,
 * and each token's float operations are the same for 1, 4, 8 and 16 tokens a call. */
#define KCAT2(a, b) a##_##b
#define KCAT(a, b) KCAT2(a, b)
#define KF(name) KCAT(name, KSFX)
#define KINL static inline KT __attribute__((always_inline))
/* Where the multi-token kernels keep each token's float sums: registers, or, where AVX2's 16
 * registers are taken by the tokens' integer sums (8 tokens), in memory (a store and a load a
 * sub-block, on nt independent chains; at one token that chain would bound the kernel): a local
 * array, not y, whose rows can lie a multiple of 4 KiB apart (y's stride is the matrix's rows),
 * where each load waited on the last token's store (4K aliasing, Zen 3). */
#define KSUMS_IN_MEMORY(nt) (!KVNNI && (nt) > 4)
/* Whether the K-quants' sub-blocks run as a loop (Q4_K / Q5_K two a pass, Q6_K four, so that
 * shifts stay constants) rather than spelled out: AVX2's multi-token kernels, whose spelled-out
 * form is too long to run from the op cache (8 tokens, AMD Zen 3: Q4_K 1.13x rolled; Q6_K's
 * 3,200-instruction kernel 1.12x in two passes). */
#define KROLL(nt) (!KVNNI && (nt) > 1)

/* 16 in every byte whose bit is set in the 32-bit mask at m (Q5_K's fifth bit). */
KINL __m256i KF(khbits)(const uint8_t *m) {
#if KVNNI
    uint32_t b;
    memcpy(&b, m, 4);
    return _mm256_maskz_mov_epi8((__mmask32)b, _mm256_set1_epi8(16));
#else
    int32_t b;
    memcpy(&b, m, 4);
    const __m256i ctl = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(b), ctl), sel);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, sel), _mm256_set1_epi8(16));
#endif
}

KINL __m256 KF(kcvt8)(const uint8_t *p, int is_signed) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)p);
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

#if KVNNI
KINL void KF(kq45k_blk)(int five, int nt, int j, const uint8_t *p, __m256 dv, __m256 mv, const void *act,
                        int64_t act_stride, int64_t b, __m256 *acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256 dsc = _mm256_mul_ps(dv, KF(kcvt8)(p + 32 + 8 * j, 0));
    const __m256 dmn = _mm256_mul_ps(mv, KF(kcvt8)(p + 96 + 8 * j, 0));
    const uint8_t *qp = p + EI_PK_HDR_Q4K + 256 * (j >> 1);
    __m256i w[8];
    for (int k = 0; k < 8; k++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qp + 32 * k));
        if (j & 1) v = _mm256_srli_epi16(v, 4);
        w[k] = _mm256_and_si256(v, m4);
        if (five) w[k] = _mm256_or_si256(w[k], KF(khbits)(p + EI_PK_Q4K_BYTES + 32 * j + 4 * k));
    }
    for (int t = 0; t < nt; t++) {
        const ei_q8a *a = (const ei_q8a *)((const uint8_t *)act + t * act_stride) + 8 * b + j;
        const __m256 isum = _mm256_cvtepi32_ps(ei_dot_vnni(w, a->q, 8));
        acc[t] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dsc, _mm256_set1_ps(a->d)), acc[t]);
        acc[t] = _mm256_fnmadd_ps(dmn, _mm256_set1_ps(a->s), acc[t]);
    }
}
#else
/* AVX2: tokens inner. Each half's 4 weight vectors are unpacked once and feed every token's
 * int16 sum (packed_dot.h's runs), all nt of them in registers (the float sums: KSUMS_IN_MEMORY);
 * each activation dword is broadcast from memory. One 16-byte load and in-lane shuffles had won
 * while the float sums lived in registers; since they moved to memory the broadcasts are 1.08x
 * for Q4_K, 1.03x for Q5_K and 1.05x for Q6_K at 8 tokens (AMD Zen 3, cache-resident). */
KINL void KF(kq45k_blk)(int five, int nt, int j, const uint8_t *p, __m256 dv, __m256 mv, const void *act,
                        int64_t act_stride, int64_t b, __m256 *acc, float *sums) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const uint8_t *qp = p + EI_PK_HDR_Q4K + 256 * (j >> 1);
    const ei_q8a *a[16];
    __m256i is[16], s16[16];
#pragma GCC unroll 16
    for (int t = 0; t < nt; t++) a[t] = (const ei_q8a *)((const uint8_t *)act + t * act_stride) + 8 * b + j;
    if (nt == 1) {   /* one token (decode): packed_dot.h's broadcast form */
        __m256i w[8];
        for (int k = 0; k < 8; k++) {
            w[k] = _mm256_loadu_si256((const __m256i *)(qp + 32 * k));
            if (j & 1) w[k] = _mm256_srli_epi16(w[k], 4);
            w[k] = _mm256_and_si256(w[k], m4);
            if (five) w[k] = _mm256_or_si256(w[k], KF(khbits)(p + EI_PK_Q4K_BYTES + 32 * j + 4 * k));
        }
        is[0] = ei_dot_avx2(w, a[0]->q, 8, EI_DOT_RUN(five ? 5 : 4));
    } else
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m256i w[4];
        for (int i = 0; i < 4; i++) {
            const int k = 4 * h + i;
            w[i] = _mm256_loadu_si256((const __m256i *)(qp + 32 * k));
            if (j & 1) w[i] = _mm256_srli_epi16(w[i], 4);
            w[i] = _mm256_and_si256(w[i], m4);
            if (five) w[i] = _mm256_or_si256(w[i], KF(khbits)(p + EI_PK_Q4K_BYTES + 32 * j + 4 * k));
        }
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) {
            const int8_t *xq = a[t]->q + 16 * h;
            __m256i p0 = _mm256_maddubs_epi16(w[0], ei_bcast4(xq));
            __m256i p1 = _mm256_maddubs_epi16(w[1], ei_bcast4(xq + 4));
            p0 = _mm256_add_epi16(p0, _mm256_maddubs_epi16(w[2], ei_bcast4(xq + 8)));
            p1 = _mm256_add_epi16(p1, _mm256_maddubs_epi16(w[3], ei_bcast4(xq + 12)));
            const __m256i s = _mm256_add_epi16(p0, p1);
            if (five) {   /* a run of 4 (packed_dot.h) */
                const __m256i s32 = _mm256_madd_epi16(s, ones);
                is[t] = h == 0 ? s32 : _mm256_add_epi32(is[t], s32);
            } else {
                s16[t] = h == 0 ? s : _mm256_add_epi16(s16[t], s);
                EI_PIN(s16[t]);
            }
        }
    }
    if (!five && nt > 1)
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) is[t] = _mm256_madd_epi16(s16[t], ones);
    const __m256 dsc = _mm256_mul_ps(dv, KF(kcvt8)(p + 32 + 8 * j, 0));
    const __m256 dmn = _mm256_mul_ps(mv, KF(kcvt8)(p + 96 + 8 * j, 0));
#pragma GCC unroll 16
    for (int t = 0; t < nt; t++) {
        __m256 r = ei_sum_get(KSUMS_IN_MEMORY(nt), acc, sums, t);
        r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(dsc, _mm256_set1_ps(a[t]->d)), r);
        r = _mm256_fnmadd_ps(dmn, _mm256_set1_ps(a[t]->s), r);
        ei_sum_put(KSUMS_IN_MEMORY(nt), acc, sums, t, r);
    }
}
#endif

/* Q4_K / Q5_K, rows 8g..8g+7, nt tokens. Per sub-block j and token:
 *   acc += isum_j * ((d * sc_j) * a_j.d) - (dmin * m_j) * a_j.s
 * (the sub-blocks are spelled out so that every shift and offset is a constant) */
KINL void KF(kq45k)(int five, int nt, const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y,
                    int64_t ldy) {
    const uint8_t *p = packed;
    const size_t ub = five ? EI_PK_Q5K_BYTES : EI_PK_Q4K_BYTES;
    __m256 acc[16];
    float sums[16 * 8] __attribute__((aligned(32)));   /* KSUMS_IN_MEMORY */
    if (KSUMS_IN_MEMORY(nt)) EI_IN_MEMORY(sums);
    ei_sums_zero(KSUMS_IN_MEMORY(nt), nt, acc, sums);
#if KVNNI
#define KQ45(j) KF(kq45k_blk)(five, nt, j, p, dv, mv, act, act_stride, b, acc)
#else
#define KQ45(j) KF(kq45k_blk)(five, nt, j, p, dv, mv, act, act_stride, b, acc, sums)
#endif
    for (int64_t b = 0; b < nb; b++, p += ub) {
        if (nt == 1) ei_prefetch_ahead(p, (int)ub);
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
        if (KROLL(nt)) {
#pragma GCC unroll 1
            for (int j = 0; j < 8; j += 2) {
                KQ45(j);
                KQ45(j + 1);
            }
        } else {
            KQ45(0); KQ45(1); KQ45(2); KQ45(3); KQ45(4); KQ45(5); KQ45(6); KQ45(7);
        }
    }
#undef KQ45
    ei_sums_store(KSUMS_IN_MEMORY(nt), nt, acc, sums, y, ldy);
}

#if KVNNI
/* The two 256-bit halves of v added (a chain's two groups). */
KINL __m256i KF(zfold)(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* One token, Q4_K / Q5_K (decode): kq45k's arithmetic, bit for bit, in half the instructions
 * a block. Two 4-byte groups a zmm register (the 8 rows of group k, then of k + 1, one 64-byte
 * load), the activation's dwords k and k + 1 put under them by one vpermd; each nibble pair is
 * loaded once for its two sub-blocks. The chain's halves sum their groups' products and are
 * added before the float part, so the integers (and all else) are kq45k's. Zen 4 runs each zmm
 * op as two halves, yet this is 1.17x the ymm form of the same scheme (cache-resident matrix,
 * scripts/bench_matvec.py), itself 1.15x kq45k: the generic kernel is bound by loads and
 * instruction count at one token, not by vpdpbusd. */
KINL void KF(kq45k_1)(int five, const void *packed, int64_t nb, const void *act, float *y) {
    const uint8_t *p = packed;
    const ei_q8a *a = act;
    const size_t ub = five ? EI_PK_Q5K_BYTES : EI_PK_Q4K_BYTES;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i i01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i two = _mm512_set1_epi32(2);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += ub, a += 8) {
        ei_prefetch_ahead(p, (int)ub);
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
#pragma GCC unroll 4
        for (int pr = 0; pr < 4; pr++) {
            const uint8_t *qp = p + EI_PK_HDR_Q4K + 256 * pr;
            const ei_q8a *a0 = a + 2 * pr, *a1 = a0 + 1;
            const __m512i x0 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a0->q));
            const __m512i x1 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a1->q));
            __m512i s = _mm512_setzero_si512(), u = _mm512_setzero_si512();
            __m512i idx = i01;
            for (int k = 0; k < 8; k += 2, idx = _mm512_add_epi32(idx, two)) {
                const __m512i v = _mm512_loadu_si512((const void *)(qp + 32 * k));
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (five) {
                    uint64_t ml, mh;
                    memcpy(&ml, p + EI_PK_Q4K_BYTES + 32 * (2 * pr) + 4 * k, 8);
                    memcpy(&mh, p + EI_PK_Q4K_BYTES + 32 * (2 * pr + 1) + 4 * k, 8);
                    lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8((__mmask64)ml, _mm512_set1_epi8(16)));
                    hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8((__mmask64)mh, _mm512_set1_epi8(16)));
                }
                s = _mm512_dpbusd_epi32(s, lo, _mm512_permutexvar_epi32(idx, x0));
                u = _mm512_dpbusd_epi32(u, hi, _mm512_permutexvar_epi32(idx, x1));
            }
            const __m256i s0 = KF(zfold)(s), u0 = KF(zfold)(u);
            const __m256 dsc0 = _mm256_mul_ps(dv, KF(kcvt8)(p + 32 + 16 * pr, 0));
            const __m256 dmn0 = _mm256_mul_ps(mv, KF(kcvt8)(p + 96 + 16 * pr, 0));
            const __m256 dsc1 = _mm256_mul_ps(dv, KF(kcvt8)(p + 40 + 16 * pr, 0));
            const __m256 dmn1 = _mm256_mul_ps(mv, KF(kcvt8)(p + 104 + 16 * pr, 0));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(dsc0, _mm256_set1_ps(a0->d)), acc);
            acc = _mm256_fnmadd_ps(dmn0, _mm256_set1_ps(a0->s), acc);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u0), _mm256_mul_ps(dsc1, _mm256_set1_ps(a1->d)), acc);
            acc = _mm256_fnmadd_ps(dmn1, _mm256_set1_ps(a1->s), acc);
        }
    }
    _mm256_storeu_ps(y, acc);
}
#endif

#if KVNNI
/* 32 * (sum of a's first 16 quants) in every lane, and of the last 16. */
KINL void KF(kasum)(const ei_q8a *a, __m256i *lo, __m256i *hi) {
    const __m256i y = _mm256_loadu_si256((const __m256i *)a->q);
    __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), y);
    s = _mm256_hadd_epi32(s, s);
    s = _mm256_slli_epi32(_mm256_hadd_epi32(s, s), 5);
    *lo = _mm256_permute2x128_si256(s, s, 0x00);
    *hi = _mm256_permute2x128_si256(s, s, 0x11);
}

KINL void KF(kq6k_blk)(int nt, int j, const uint8_t *p, __m256 dv, const void *act, int64_t act_stride, int64_t b,
                       __m256 *acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const int h = j >> 2, c = j & 1, hi = (j >> 1) & 1, s2 = 2 * (j & 3);
    const __m128i sc2 = _mm_loadu_si128((const __m128i *)(p + 16 + 16 * j));
    const __m256i sclo = _mm256_cvtepi8_epi32(sc2), schi = _mm256_cvtepi8_epi32(_mm_srli_si128(sc2, 8));
    __m256i w[8];
    for (int k = 0; k < 8; k++) {
        __m256i l = _mm256_loadu_si256((const __m256i *)(p + ei_q6k_ql(2 * h + c, 32 * k)));
        __m256i u = _mm256_loadu_si256((const __m256i *)(p + ei_q6k_qh(h, 32 * k)));
        if (hi) l = _mm256_srli_epi16(l, 4);
        u = s2 == 0 ? _mm256_slli_epi16(u, 4) : s2 == 2 ? _mm256_slli_epi16(u, 2) : s2 == 6 ? _mm256_srli_epi16(u, 2) : u;
        w[k] = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(u, m30));
    }
    for (int t = 0; t < nt; t++) {
        const ei_q8a *a = (const ei_q8a *)((const uint8_t *)act + t * act_stride) + 8 * b + j;
        const __m256i s0 = ei_dot_vnni(w, a->q, 4), s1 = ei_dot_vnni(w + 4, a->q + 16, 4);
        __m256i a0, a1;
        KF(kasum)(a, &a0, &a1);
        const __m256i isum = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_sub_epi32(s0, a0), sclo),
                                              _mm256_mullo_epi32(_mm256_sub_epi32(s1, a1), schi));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dv, _mm256_set1_ps(a->d)), acc[t]);
    }
}

#else
/* Q6_K block j's scales for vpmaddwd (8 rows' low-half scales, then their high-half ones, at
 * sc_bytes): sc[half] holds (sc, sc) in each row's lane, sc32 (32 sc_lo, 32 sc_hi). */
KINL void KF(q6_scales)(const uint8_t *sc_bytes, __m256i sc[2], __m256i *sc32) {
    const __m128i sc2 = _mm_loadu_si128((const __m128i *)sc_bytes);
    sc[0] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc2, sc2));
    sc[1] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(sc2, sc2));
    *sc32 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sc2, _mm_srli_si128(sc2, 8))), 5);
}

/* The block's offset term, -32 (sc_lo sum_lo + sc_hi sum_hi), from its half sums at hs
 * (-32 sum_lo, -32 sum_hi; ei_act_half_sums): (-sum_lo, -sum_hi) as an int16 pair in every
 * lane, against sc32 (|sum| <= 16 * 128, so the pair fits). */
KINL __m256i KF(q6_offsets)(const void *hs, __m256i sc32) {
    int64_t hs2;
    memcpy(&hs2, hs, 8);
    const __m256i neg = _mm256_srai_epi32(_mm256_set1_epi64x(hs2), 5);
    return _mm256_madd_epi16(_mm256_packs_epi32(neg, neg), sc32);
}

/* AVX2: kq45k_blk's scheme (tokens inner, each activation dword broadcast from memory, the
 * float sums by KSUMS_IN_MEMORY), one half of the block at a time so that only its 4 weight
 * vectors are held. The scales are applied in the integers: vpmaddwd widens each half's int16
 * runs (of 2, packed_dot.h) times its scale, and one more vpmaddwd adds both halves' offsets,
 * (-sum_lo, -sum_hi) of the activation against (32 sc_lo, 32 sc_hi) (q6_offsets). The int32 total
 * is exact (|.| <= 2 * 16 * 32 * 128 * 128 = 2^24), so its one conversion rounds it as kq6k_1's
 * fmadd(hi, sc_hi, lo * sc_lo) rounds the same exact sum: the results are the one-token kernel's
 * bit for bit. Against the scales in float (two conversions, a product and the low half's sum in
 * memory a token) 1.08-1.10x at 8 tokens, 1.17x at 4 (AMD Zen 3, cache-resident); 3B-shape
 * Q4_K_M prefill 1.06x. */
KINL void KF(kq6k_blk)(int nt, int j, const uint8_t *p, __m256 dv, const void *act, int64_t act_stride, int64_t nb,
                       int64_t b, __m256 *acc, float *sums) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const int h = j >> 2, c = j & 1, hi = (j >> 1) & 1, s2 = 2 * (j & 3);
    __m256i sc[2], sc32;
    KF(q6_scales)(p + 16 + 16 * j, sc, &sc32);
    /* a token's half sums lie this many bytes after its block */
    const int64_t blk = 8 * b + j, hs_off = 8 * nb * (int64_t)sizeof(ei_q8a) + blk * 8 - blk * (int64_t)sizeof(ei_q8a);
    __m256i is[16];
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
        __m256i w[4];
        for (int i = 0; i < 4; i++) {
            const int k = 4 * half + i;
            __m256i l = _mm256_loadu_si256((const __m256i *)(p + ei_q6k_ql(2 * h + c, 32 * k)));
            __m256i u = _mm256_loadu_si256((const __m256i *)(p + ei_q6k_qh(h, 32 * k)));
            if (hi) l = _mm256_srli_epi16(l, 4);
            u = s2 == 0 ? _mm256_slli_epi16(u, 4) : s2 == 2 ? _mm256_slli_epi16(u, 2) : s2 == 6 ? _mm256_srli_epi16(u, 2) : u;
            w[i] = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(u, m30));
        }
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) {
            const ei_q8a *a = (const ei_q8a *)((const uint8_t *)act + t * act_stride) + blk;
            const int8_t *xq = a->q + 16 * half;
            const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], ei_bcast4(xq)),
                                                _mm256_maddubs_epi16(w[1], ei_bcast4(xq + 4)));
            const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], ei_bcast4(xq + 8)),
                                                _mm256_maddubs_epi16(w[3], ei_bcast4(xq + 12)));
            __m256i s = _mm256_add_epi32(_mm256_madd_epi16(p0, sc[half]), _mm256_madd_epi16(p1, sc[half]));
            is[t] = half == 0 ? _mm256_add_epi32(s, KF(q6_offsets)((const uint8_t *)a + hs_off, sc32))
                              : _mm256_add_epi32(is[t], s);
            EI_PIN(is[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < nt; t++) {
        const ei_q8a *a = (const ei_q8a *)((const uint8_t *)act + t * act_stride) + blk;
        ei_sum_put(KSUMS_IN_MEMORY(nt), acc, sums, t,
                   _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), _mm256_mul_ps(dv, _mm256_set1_ps(a->d)),
                                   ei_sum_get(KSUMS_IN_MEMORY(nt), acc, sums, t)));
    }
}
#endif

#if KVNNI
/* One token, Q6_K (decode): kq6k's arithmetic, bit for bit. The four blocks 4h..4h+3 that
 * share the 2-bit tops of quad h go together, so each ql and qh byte is loaded once (kq6k
 * loads qh four times and ql twice); two 4-byte groups a zmm register with the activation's
 * dwords put under them by vpermd (as kq45k_1); each half's chain starts, in its low lanes, at
 * the activation row's -32 * (sum of the half) (ei_act_half_sums, as zq6k) instead of kasum's
 * sum. The zmm form is 1.10x the ymm one on Zen 4 (cache-resident, scripts/bench_matvec.py). */
KINL void KF(kq6k_1)(int pf, const void *packed, int64_t nb, const void *act, float *y) {   /* pf: as zq45k */
    const uint8_t *p = packed;
    const ei_q8a *a = act;
    const int32_t *hs = ei_act_half_sums(act, 8 * nb);
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i i01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += EI_PK_Q6K_BYTES, a += 8, hs += 16) {
        if (pf) ei_prefetch_ahead(p, EI_PK_Q6K_BYTES);
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const ei_q8a *aq = a + 4 * h;
            const int32_t *hq = hs + 8 * h;
            __m512i s[8], x[4];   /* block i's halves: s[2i], s[2i + 1], the start in the low lanes */
            for (int i = 0; i < 8; i++) s[i] = _mm512_maskz_set1_epi32((__mmask16)0xff, hq[i]);
            for (int i = 0; i < 4; i++) x[i] = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)aq[i].q));
#pragma GCC unroll 4
            for (int k = 0; k < 8; k += 2) {
                const int half = k >> 2;
                const __m512i idx = _mm512_add_epi32(i01, _mm512_set1_epi32(k));
                const __m512i l0 = _mm512_loadu_si512((const void *)(p + ei_q6k_ql(2 * h, 32 * k)));
                const __m512i l1 = _mm512_loadu_si512((const void *)(p + ei_q6k_ql(2 * h + 1, 32 * k)));
                const __m512i u = _mm512_loadu_si512((const void *)(p + ei_q6k_qh(h, 32 * k)));
                const __m512i w0 = _mm512_ternarylogic_epi32(l0, _mm512_and_si512(_mm512_slli_epi16(u, 4), m30), m4, 0xEC);
                const __m512i w1 = _mm512_ternarylogic_epi32(l1, _mm512_and_si512(_mm512_slli_epi16(u, 2), m30), m4, 0xEC);
                const __m512i w2 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l0, 4), _mm512_and_si512(u, m30), m4, 0xEC);
                const __m512i w3 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l1, 4),
                                                             _mm512_and_si512(_mm512_srli_epi16(u, 2), m30), m4, 0xEC);
                s[0 + half] = _mm512_dpbusd_epi32(s[0 + half], w0, _mm512_permutexvar_epi32(idx, x[0]));
                s[2 + half] = _mm512_dpbusd_epi32(s[2 + half], w1, _mm512_permutexvar_epi32(idx, x[1]));
                s[4 + half] = _mm512_dpbusd_epi32(s[4 + half], w2, _mm512_permutexvar_epi32(idx, x[2]));
                s[6 + half] = _mm512_dpbusd_epi32(s[6 + half], w3, _mm512_permutexvar_epi32(idx, x[3]));
            }
            for (int i = 0; i < 4; i++) {
                const int j = 4 * h + i;
                const __m128i sc2 = _mm_loadu_si128((const __m128i *)(p + 16 + 16 * j));
                const __m256i sclo = _mm256_cvtepi8_epi32(sc2), schi = _mm256_cvtepi8_epi32(_mm_srli_si128(sc2, 8));
                const __m256i isum = _mm256_add_epi32(_mm256_mullo_epi32(KF(zfold)(s[2 * i]), sclo),
                                                      _mm256_mullo_epi32(KF(zfold)(s[2 * i + 1]), schi));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dv, _mm256_set1_ps(aq[i].d)), acc);
            }
        }
    }
    _mm256_storeu_ps(y, acc);
}
#else
/* One token, Q6_K, AVX2: the four blocks of a quad share their 2-bit tops (qh); blocks i and
 * i + 2 also share their nibble bytes (ql), so each pass takes one such pair (ql loaded once, qh
 * twice a quad) with the chains started at the activation's half sums, in-lane shuffles, and the
 * scales applied in float: the fmadd rounds the exact scaled sum once, as kq6k_blk's conversion
 * does (its integer form spilled the scale vectors here: 0.97-0.99x). Taking all four blocks a
 * pass (each byte loaded once) held 23 vectors and spilled: the pairs are 1.06x on one thread,
 * cache-resident, and the same streaming at two threads (AMD Zen 3). The blocks' float sums are
 * added in block order. */
KINL void KF(kq6k_1)(int pf, const void *packed, int64_t nb, const void *act, float *y) {   /* pf: as zq45k */
    const uint8_t *p = packed;
    const ei_q8a *a = act;
    const int32_t *hs = ei_act_half_sums(act, 8 * nb);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += EI_PK_Q6K_BYTES, a += 8, hs += 16) {
        if (pf) ei_prefetch_ahead(p, EI_PK_Q6K_BYTES);
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 isum[4];   /* block 4h + i's integer sum times its scales, in float */
#pragma GCC unroll 2
            for (int pb = 0; pb < 2; pb++) {   /* blocks pb and pb + 2: nibble bytes ql[2h + pb] */
                __m256i s[2][2];   /* [block pb or pb + 2][half] */
                for (int e = 0; e < 2; e++)
                    for (int half = 0; half < 2; half++) s[e][half] = _mm256_set1_epi32(hs[8 * h + 2 * (pb + 2 * e) + half]);
#pragma GCC unroll 2
                for (int half = 0; half < 2; half++) {
                    __m256i x[2];
                    for (int e = 0; e < 2; e++)
                        x[e] = _mm256_broadcastsi128_si256(
                            _mm_loadu_si128((const __m128i *)(a[4 * h + pb + 2 * e].q + 16 * half)));
#pragma GCC unroll 4
                    for (int k = 4 * half; k < 4 * half + 4; k += 2) {   /* groups k, k + 1: a run of 2 */
                        __m256i w[2][2];   /* [block][group] */
                        for (int g = 0; g < 2; g++) {
                            const __m256i l = _mm256_loadu_si256((const __m256i *)(p + ei_q6k_ql(2 * h + pb, 32 * (k + g))));
                            const __m256i u = _mm256_loadu_si256((const __m256i *)(p + ei_q6k_qh(h, 32 * (k + g))));
                            /* block pb: low nibbles, tops at bits 2pb..; block pb + 2: high nibbles */
                            const __m256i t0 = pb ? _mm256_slli_epi16(u, 2) : _mm256_slli_epi16(u, 4);
                            const __m256i t2 = pb ? _mm256_srli_epi16(u, 2) : u;
                            w[0][g] = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(t0, m30));
                            w[1][g] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 4), m4),
                                                      _mm256_and_si256(t2, m30));
                        }
                        const int sh0 = (k & 3) == 0 ? 0x00 : 0xaa, sh1 = (k & 3) == 0 ? 0x55 : 0xff;
                        for (int e = 0; e < 2; e++)
                            s[e][half] = _mm256_add_epi32(
                                s[e][half],
                                _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w[e][0], _mm256_shuffle_epi32(x[e], sh0)),
                                                                   _mm256_maddubs_epi16(w[e][1], _mm256_shuffle_epi32(x[e], sh1))),
                                                  ones));
                    }
                }
                for (int e = 0; e < 2; e++) {   /* the scales in float, exact (|s| <= 2^16, |sc| <= 128) */
                    const int i = pb + 2 * e;
                    const __m128i sc2 = _mm_loadu_si128((const __m128i *)(p + 16 + 16 * (4 * h + i)));
                    const __m256 sclo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc2));
                    const __m256 schi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc2, 8)));
                    isum[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[e][1]), schi,
                                              _mm256_mul_ps(_mm256_cvtepi32_ps(s[e][0]), sclo));
                }
            }
            for (int i = 0; i < 4; i++)
                acc = _mm256_fmadd_ps(isum[i], _mm256_mul_ps(dv, _mm256_set1_ps(a[4 * h + i].d)), acc);
        }
    }
    _mm256_storeu_ps(y, acc);
}
#endif

/* Q6_K, rows 8g..8g+7, nt tokens. Per activation block j and token:
 *   acc += (sc_2j * sum_lo (q - 32) a + sc_2j+1 * sum_hi (q - 32) a) * (d * a_j.d)
 * with q unsigned (0..63) in the dot and 32 * sum(a) subtracted per half. */
KINL void KF(kq6k)(int nt, const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y,
                   int64_t ldy) {
    const uint8_t *p = packed;
    __m256 acc[16];
    float sums[16 * 8] __attribute__((aligned(32)));   /* KSUMS_IN_MEMORY */
    if (KSUMS_IN_MEMORY(nt)) EI_IN_MEMORY(sums);
    ei_sums_zero(KSUMS_IN_MEMORY(nt), nt, acc, sums);
#if KVNNI
#define KQ6(j) KF(kq6k_blk)(nt, j, p, dv, act, act_stride, b, acc)
#else
#define KQ6(j) KF(kq6k_blk)(nt, j, p, dv, act, act_stride, nb, b, acc, sums)
#endif
    for (int64_t b = 0; b < nb; b++, p += EI_PK_Q6K_BYTES) {
        if (nt == 1) ei_prefetch_ahead(p, EI_PK_Q6K_BYTES);
        const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        if (KROLL(nt)) {   /* a quad of blocks a pass: the shifts depend on j % 4 only */
            for (int q = 0; q < 2; q++) {
                __asm__("" : "+r"(q));   /* GCC peels a 2-pass loop whatever the pragma says */
                const int j = 4 * q;
                KQ6(j); KQ6(j + 1); KQ6(j + 2); KQ6(j + 3);
            }
        } else {
            KQ6(0); KQ6(1); KQ6(2); KQ6(3); KQ6(4); KQ6(5); KQ6(6); KQ6(7);
        }
    }
#undef KQ6
    ei_sums_store(KSUMS_IN_MEMORY(nt), nt, acc, sums, y, ldy);
}

#if KVNNI
/* AVX-512: two row groups (16 rows) a zmm register (packed_zmm.h), where vpdpbusd does twice
 * the work of the ymm form at the same rate (2 a cycle) on the Intel host; on Zen 4, which runs
 * it in two halves, these prefill kernels are still 1.40x. Q4_K's groups come in row pairs,
 * interleaved within each super-block (packed.h), so each field of 16 rows is one load: its
 * 16-row kernels run every token count, one token 1.05-1.08x kq45k_1 on a cache-resident
 * matrix and the same rate streaming, 16 tokens 1.07x and 64 1.02x the two-run reads before
 * (Zen 4, one thread, scripts/bench_matvec.py). Q6_K's one-token form in pairs streamed
 * 0.88-0.92x kq6k_1 (1.24-1.26x cache-resident) and Q5_K's ran 0.84x kq45k_1: both keep 8-row
 * groups one after the other, and their 16-row prefill kernels read a group pair as two runs.
 * Every lane runs the 8-row kernels' operations in the same order, so each (row, token)
 * result is theirs bit for bit. */
/* 8 u8 of each group (sub-block scales or mins of 8 rows) as 16 floats */
KINL __m512 KF(zu8f)(const uint8_t *p, size_t gs) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(zld8x2(p, gs)));
}

/* dword k of the 32 activation bytes in x's low half, in every lane */
#define zdword(x, k) _mm512_permutexvar_epi32(_mm512_set1_epi32(k), (x))

/* Where the 16-row Q4_K / Q5_K kernels find the two groups' bytes: the field at offset o of the
 * 8-row layout (packed.h) lies at m * o, the second group's copy one f16 chunk, u8 chunk or quant
 * chunk later (a row pair: m = 2 and 16, 8, 32 bytes; two groups one after the other: m = 1 and
 * the group's bytes for all three). */
typedef struct {
    int m;
    size_t f16, u8, q;
} kgeo;
static const kgeo KGEO_PAIR = {2, 16, 8, 32};

/* Q4_K / Q5_K over 16 rows, sub-blocks 2p and 2p+1 (nibble pair pr) together: one load of
 * the pair serves both (+5% on the 1B-shape Q4_K_M prefill over one sub-block at a time,
 * in-process A/B, 16 reps). Per token and sub-block the float operations are kq45k's. */
KINL void KF(zq45k_pair)(int five, int nt, int pr, const uint8_t *p, kgeo G, __m512 dv, __m512 mv,
                         const void *act, int64_t act_stride, int64_t b, __m512 *acc) {
    const uint8_t *sc = p + G.m * (32 + 16 * pr), *mn = p + G.m * (96 + 16 * pr);
    const __m512 dsc0 = _mm512_mul_ps(dv, KF(zu8f)(sc, G.u8)), dsc1 = _mm512_mul_ps(dv, KF(zu8f)(sc + 8 * G.m, G.u8));
    const __m512 dmn0 = _mm512_mul_ps(mv, KF(zu8f)(mn, G.u8)), dmn1 = _mm512_mul_ps(mv, KF(zu8f)(mn + 8 * G.m, G.u8));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512i w0[8], w1[8];
    for (int k = 0; k < 8; k++) {
        const __m512i v = zld2(p + G.m * (EI_PK_HDR_Q4K + 256 * pr + 32 * k), G.q);
        w0[k] = _mm512_and_si512(v, m4);
        w1[k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if (five)   /* Q5_K (one group after the other): each quant's fifth bit */
        for (int k = 0; k < 8; k++)
            for (int h = 0; h < 2; h++) {
                const int j = 2 * pr + h;
                uint32_t lo, hi;
                memcpy(&lo, p + EI_PK_Q4K_BYTES + 32 * j + 4 * k, 4);
                memcpy(&hi, p + G.q + EI_PK_Q4K_BYTES + 32 * j + 4 * k, 4);
                const __m512i hb = _mm512_maskz_mov_epi8(((__mmask64)hi << 32) | lo, _mm512_set1_epi8(16));
                if (h) w1[k] = _mm512_or_si512(w1[k], hb);
                else w0[k] = _mm512_or_si512(w0[k], hb);
            }
    if (nt == 1) {   /* two chains a sub-block (k even, odd), their sums added as integers */
        const ei_q8a *a = (const ei_q8a *)act + 8 * b + 2 * pr;
        const __m512i z = _mm512_setzero_si512();
        /* each activation dword put in every lane by a vpermd: broadcasts read inside the
         * vpdpbusd (zdpb4) ran 1.12-1.17x kq45k_1 on a cache-resident matrix but streamed
         * 0.90-0.99x its rate (Zen 4, one thread) */
        const __m512i x0 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a[0].q));
        const __m512i x1 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a[1].q));
        __m512i s0 = _mm512_dpbusd_epi32(z, w0[0], zdword(x0, 0)), s1 = _mm512_dpbusd_epi32(z, w0[1], zdword(x0, 1));
        __m512i u0 = _mm512_dpbusd_epi32(z, w1[0], zdword(x1, 0)), u1 = _mm512_dpbusd_epi32(z, w1[1], zdword(x1, 1));
        for (int k = 2; k < 8; k += 2) {
            s0 = _mm512_dpbusd_epi32(s0, w0[k], zdword(x0, k)), s1 = _mm512_dpbusd_epi32(s1, w0[k + 1], zdword(x0, k + 1));
            u0 = _mm512_dpbusd_epi32(u0, w1[k], zdword(x1, k)), u1 = _mm512_dpbusd_epi32(u1, w1[k + 1], zdword(x1, k + 1));
        }
        __m512 r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                   _mm512_mul_ps(dsc0, _mm512_set1_ps(a[0].d)), acc[0]);
        r = _mm512_fnmadd_ps(dmn0, _mm512_set1_ps(a[0].s), r);
        r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(u0, u1)), _mm512_mul_ps(dsc1, _mm512_set1_ps(a[1].d)), r);
        acc[0] = _mm512_fnmadd_ps(dmn1, _mm512_set1_ps(a[1].s), r);
        return;
    }
    /* Four tokens a pass, one vpdpbusd chain per (token, sub-block): eight independent chains.
     * Two tokens a pass (four chains) left vpdpbusd waiting on the chains' latency on Zen 5:
     * four make the 16 x 16 tile 1.04-1.17x faster (cache-resident, interleaved A/B), with
     * each broadcast read inside the vpdpbusd (zdpb4; without it the four tokens gain 2-4%).
     * Each token's float operations are unchanged. nt is a multiple of 4 (4, 16). */
    enum { TPP = 4 };
    for (int t = 0; t < nt; t += TPP) {
        const ei_q8a *a[TPP];
        __m512i s[TPP], u[TPP];
        for (int i = 0; i < TPP; i++) {
            a[i] = (const ei_q8a *)((const uint8_t *)act + (t + i) * act_stride) + 8 * b + 2 * pr;
            s[i] = zdpb4(_mm512_setzero_si512(), w0[0], a[i][0].q);
            u[i] = zdpb4(_mm512_setzero_si512(), w1[0], a[i][1].q);
        }
        for (int k = 1; k < 8; k++)
            for (int i = 0; i < TPP; i++) {
                s[i] = zdpb4(s[i], w0[k], a[i][0].q + 4 * k);
                u[i] = zdpb4(u[i], w1[k], a[i][1].q + 4 * k);
            }
        for (int i = 0; i < TPP; i++) {
            __m512 r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), _mm512_mul_ps(dsc0, _mm512_set1_ps(a[i][0].d)), acc[t + i]);
            r = _mm512_fnmadd_ps(dmn0, _mm512_set1_ps(a[i][0].s), r);
            r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u[i]), _mm512_mul_ps(dsc1, _mm512_set1_ps(a[i][1].d)), r);
            acc[t + i] = _mm512_fnmadd_ps(dmn1, _mm512_set1_ps(a[i][1].s), r);
        }
    }
}

/* paired: the two groups in a row pair (Q4_K), else one group after the other (Q5_K); pf: prefetch
 * ahead (ei_prefetch_ahead; one token only, as a decode streams the matrix once) */
KINL void KF(zq45k)(int five, int nt, int paired, int pf, const void *packed, int64_t nb, const void *act, int64_t act_stride,
                    float *y, int64_t ldy) {
    const uint8_t *p = packed;
    const size_t ub = five ? EI_PK_Q5K_BYTES : EI_PK_Q4K_BYTES, gs = (size_t)nb * ub;
    const kgeo G = paired ? KGEO_PAIR : (kgeo){1, gs, gs, gs};
    __m512 acc[16];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += paired ? 2 * ub : ub) {
        if (pf) ei_prefetch_ahead(p, (int)(2 * ub));
        const __m512 dv = zh2f(p, G.f16), mv = zh2f(p + 16 * G.m, G.f16);
        KF(zq45k_pair)(five, nt, 0, p, G, dv, mv, act, act_stride, b, acc);
        KF(zq45k_pair)(five, nt, 1, p, G, dv, mv, act, act_stride, b, acc);
        KF(zq45k_pair)(five, nt, 2, p, G, dv, mv, act, act_stride, b, acc);
        KF(zq45k_pair)(five, nt, 3, p, G, dv, mv, act, act_stride, b, acc);
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

KINL void KF(zq6k_blk)(int nt, int j, const uint8_t *p, size_t gs, __m512 dv, const void *act, int64_t act_stride,
                       int64_t nb, int64_t b, __m512 *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const int h = j >> 2, c = j & 1, hi = (j >> 1) & 1, s2 = 2 * (j & 3);
    const __m128i sa = _mm_loadu_si128((const __m128i *)(p + 16 + 16 * j));
    const __m128i sb = _mm_loadu_si128((const __m128i *)(p + gs + 16 + 16 * j));
    const __m512 sclo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi64(sa, sb)));
    const __m512 schi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi64(sa, sb)));
    __m512i w[8];
    for (int k = 0; k < 8; k++) {
        __m512i l = zld2(p + ei_q6k_ql(2 * h + c, 32 * k), gs);
        __m512i u = zld2(p + ei_q6k_qh(h, 32 * k), gs);
        if (hi) l = _mm512_srli_epi16(l, 4);
        u = s2 == 0 ? _mm512_slli_epi16(u, 4) : s2 == 2 ? _mm512_slli_epi16(u, 2) : s2 == 6 ? _mm512_srli_epi16(u, 2) : u;
        w[k] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(u, m30));
    }
    for (int t = 0; t < nt; t++) {
        const ei_q8a *a = (const ei_q8a *)((const uint8_t *)act + t * act_stride) + 8 * b + j;
        const int32_t *hs = ei_act_half_sums((const uint8_t *)act + t * act_stride, 8 * nb) + 2 * (8 * b + j);
        /* each chain starts at the token's -32 * (sum of the half's quants), so it ends at the
         * dot with q - 32 without a subtraction (3B-shape Q6_K pp256 +6-11%, A/B, 6 reps) */
        __m512i s0 = _mm512_set1_epi32(hs[0]), s1 = _mm512_set1_epi32(hs[1]);
        for (int k = 0; k < 4; k++) {
            s0 = _mm512_dpbusd_epi32(s0, w[k], zbcast4(a->q + 4 * k));
            s1 = _mm512_dpbusd_epi32(s1, w[k + 4], zbcast4(a->q + 16 + 4 * k));
        }
        /* kq6k's sc_lo * lo + sc_hi * up, in float: |lo|, |up| <= 16 * 32 * 127 < 2^17 and
         * |sc| <= 128, so each product is exact and the fmadd rounds the exact sum once,
         * as kq6k's conversion of its int32 sum does; two vpmulld cost 4 uops */
        const __m512 lo = _mm512_cvtepi32_ps(s0);
        const __m512 up = _mm512_cvtepi32_ps(s1);
        const __m512 isum = _mm512_fmadd_ps(up, schi, _mm512_mul_ps(lo, sclo));
        acc[t] = _mm512_fmadd_ps(isum, _mm512_mul_ps(dv, _mm512_set1_ps(a->d)), acc[t]);
    }
}

KINL void KF(zq6k)(int nt, const void *packed, int64_t nb, const void *act, int64_t act_stride, float *y, int64_t ldy) {
    const uint8_t *p = packed;
    const size_t gs = (size_t)nb * EI_PK_Q6K_BYTES;
    __m512 acc[16];
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += EI_PK_Q6K_BYTES) {
        const __m512 dv = zh2f(p, gs);
#define ZQ6(j) KF(zq6k_blk)(nt, j, p, gs, dv, act, act_stride, nb, b, acc)
        ZQ6(0); ZQ6(1); ZQ6(2); ZQ6(3); ZQ6(4); ZQ6(5); ZQ6(6); ZQ6(7);
#undef ZQ6
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + t * ldy, acc[t]);
}

KT void KF(ei_packed_q4_k_x1r16)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(zq45k)(0, 1, 1, 1, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q4_k_x1r16_hw)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(zq45k)(0, 1, 1, nb > EI_HW_PF_MAX_NB, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q4_k_x4r16)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(zq45k)(0, 4, 1, 0, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q4_k_x16r16)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(zq45k)(0, 16, 1, 0, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q5_k_x16r16)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(zq45k)(1, 16, 0, 0, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q6_k_x16r16)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(zq6k)(16, pk, nb, act, st, y, ldy);
}
#endif

KT void KF(ei_packed_q4_k_x1)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
#if KVNNI
    (void)st, (void)ldy;
    KF(kq45k_1)(0, pk, nb, act, y);
#else   /* the scheme in ymm with maddubs measured 0.91x kq45k (AVX2 table, Zen 4) */
    KF(kq45k)(0, 1, pk, nb, act, st, y, ldy);
#endif
}
KT void KF(ei_packed_q4_k_x4)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(kq45k)(0, 4, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q5_k_x1)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
#if KVNNI
    (void)st, (void)ldy;
    KF(kq45k_1)(1, pk, nb, act, y);
#else   /* the scheme in ymm with maddubs measured 0.91x kq45k (AVX2 table, Zen 4) */
    KF(kq45k)(1, 1, pk, nb, act, st, y, ldy);
#endif
}
KT void KF(ei_packed_q5_k_x4)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(kq45k)(1, 4, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q6_k_x1)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    (void)st, (void)ldy;
    KF(kq6k_1)(1, pk, nb, act, y);
}
#if KVNNI
KT void KF(ei_packed_q6_k_x1_hw)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    (void)st, (void)ldy;
    KF(kq6k_1)(nb > EI_HW_PF_MAX_NB, pk, nb, act, y);
}
#endif
KT void KF(ei_packed_q6_k_x4)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(kq6k)(4, pk, nb, act, st, y, ldy);
}

KT void KF(ei_packed_q4_k_x8)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(kq45k)(0, 8, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q5_k_x8)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(kq45k)(1, 8, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q6_k_x8)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(kq6k)(8, pk, nb, act, st, y, ldy);
}

KT void KF(ei_packed_q4_k_x16)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(kq45k)(0, 16, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q5_k_x16)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(kq45k)(1, 16, pk, nb, act, st, y, ldy);
}
KT void KF(ei_packed_q6_k_x16)(const void *pk, int64_t nb, const void *act, int64_t st, float *y, int64_t ldy) {
    KF(kq6k)(16, pk, nb, act, st, y, ldy);
}

#undef KCAT2
#undef KCAT
#undef KF
#undef KINL
