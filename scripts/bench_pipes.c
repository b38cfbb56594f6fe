/* Which vector instructions take vpdpbusd's issue slots: one thread runs 8 independent zmm
 * vpdpbusd chains a loop pass, alone and with 4 (or 8) independent instructions of one other kind
 * beside them, and prints how many vpdpbusd a second it issued. Where the rate falls the other
 * instruction runs on vpdpbusd's pipes; where it holds, on others. This bounds the prefill
 * kernels: each of their float operations on a multiply pipe costs one vpdpbusd.
 *
 *   gcc -O2 scripts/bench_pipes.c -o /tmp/bench_pipes && /tmp/bench_pipes     (AVX-512 VNNI only)
 */
#include <stdio.h>
#include <time.h>

#define PASSES 100000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define DP8                                                                                              \
    "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n vpdpbusd %%zmm30, %%zmm31, %%zmm1\n"                             \
    "vpdpbusd %%zmm30, %%zmm31, %%zmm2\n vpdpbusd %%zmm30, %%zmm31, %%zmm3\n"                             \
    "vpdpbusd %%zmm30, %%zmm31, %%zmm4\n vpdpbusd %%zmm30, %%zmm31, %%zmm5\n"                             \
    "vpdpbusd %%zmm30, %%zmm31, %%zmm6\n vpdpbusd %%zmm30, %%zmm31, %%zmm7\n"
/* four independent instances of a two-operand (a, b -> b) or one-operand (a -> b) instruction */
#define X4(op)                                                                                           \
    op " %%zmm30, %%zmm10, %%zmm10\n " op " %%zmm30, %%zmm11, %%zmm11\n "                                 \
    op " %%zmm30, %%zmm12, %%zmm12\n " op " %%zmm30, %%zmm13, %%zmm13\n"
#define X4U(op) op " %%zmm20, %%zmm10\n " op " %%zmm21, %%zmm11\n " op " %%zmm22, %%zmm12\n " op " %%zmm23, %%zmm13\n"
#define X4H(op) op " %%ymm20, %%zmm10\n " op " %%ymm21, %%zmm11\n " op " %%ymm22, %%zmm12\n " op " %%ymm23, %%zmm13\n"
#define X4I(op) op " $4, %%zmm30, %%zmm10\n " op " $4, %%zmm30, %%zmm11\n " op " $4, %%zmm30, %%zmm12\n " op " $4, %%zmm30, %%zmm13\n"

#define RUN(name, body)                                                                                  \
    do {                                                                                                 \
        const double t0 = now();                                                                         \
        for (long i = 0; i < PASSES; i++) __asm__ volatile(body ::: "memory");                          \
        const double rate = PASSES * 8 / (now() - t0) / 1e9;                                             \
        if (!base) base = rate;                                                                          \
        printf("%-28s %5.2f G vpdpbusd/s  %4.2f\n", name, rate, rate / base);                            \
    } while (0)

__attribute__((target("avx512f,avx512bw,avx512vnni,avx512dq"))) int main(void) {
    double base = 0;
    __asm__ volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n vpxord %%zmm31, %%zmm31, %%zmm31\n"
                     "vpxord %%zmm10, %%zmm10, %%zmm10\n vpxord %%zmm11, %%zmm11, %%zmm11\n"
                     "vpxord %%zmm12, %%zmm12, %%zmm12\n vpxord %%zmm13, %%zmm13, %%zmm13\n" ::: "memory");
    printf("beside 8 vpdpbusd zmm a pass                 rate   of alone\n");
    RUN("nothing", DP8);
    RUN("4 vfmadd231ps", DP8 X4("vfmadd231ps"));
    RUN("8 vfmadd231ps", DP8 X4("vfmadd231ps") X4("vfmadd231ps"));
    RUN("4 vmulps", DP8 X4("vmulps"));
    RUN("4 vaddps", DP8 X4("vaddps"));
    RUN("4 vcvtdq2ps", DP8 X4U("vcvtdq2ps"));
    RUN("4 vcvtph2ps", DP8 X4H("vcvtph2ps"));
    RUN("4 vpaddd", DP8 X4("vpaddd"));
    RUN("4 vpandd", DP8 X4("vpandd"));
    RUN("4 vpsrlw", DP8 X4I("vpsrlw"));
    RUN("4 vpmulld", DP8 X4("vpmulld"));
    RUN("4 vpmaddwd", DP8 X4("vpmaddwd"));
    return 0;
}
