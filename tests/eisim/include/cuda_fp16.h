/* eisim: cuda_fp16.h on the CPU. Conversions round to nearest even, as the
 * device's __float2half_rn does (GCC's _Float16 does it in software). */
#ifndef EISIM_CUDA_FP16_H
#define EISIM_CUDA_FP16_H
#include "cuda_runtime.h"

struct __half {
    unsigned short x;
};
struct alignas(4) __half2 {
    __half x, y;
};

inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline float __half2float(__half h) {
    _Float16 f;
    memcpy(&f, &h.x, 2);
    return (float)f;
}
inline __half __float2half_rn(float v) {
    const _Float16 f = (_Float16)v;
    __half h;
    memcpy(&h.x, &f, 2);
    return h;
}
inline __half __float2half(float v) { return __float2half_rn(v); }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
#endif
