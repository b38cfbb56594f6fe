/* eisim: the CUDA runtime API and device language, emulated on the CPU.
 *
 * This header stands in for the toolkit's cuda_runtime.h when the .cu files of native/cuda
 * are compiled as host C++ (scripts/build_cuda_sim.sh). Kernels run unchanged:
 * every CUDA thread is a fiber, a block's fibers switch at __syncthreads() and
 * at warp shuffles (which exchange values lane by lane, as a warp does), and
 * blocks are spread over OS threads. It exists so that the CUDA backend's tests
 * run, and fail on a wrong kernel, on machines without a GPU; it says nothing
 * about speed. What it checks beyond the results is listed in eisim.cpp. */
#ifndef EISIM_CUDA_RUNTIME_H
#define EISIM_CUDA_RUNTIME_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>

/* ---------------------------------------------------------------- language */
/* The vector types carry CUDA's alignment, so that the build's -fsanitize=alignment
 * catches a misaligned vector load as the GPU would. */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
/* One block runs at a time on an OS thread, so a thread-local static is
 * exactly one block's shared memory. */
#define __shared__ static thread_local

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(8) uint2 {
    unsigned x, y;
};

/* ---------------------------------------------------------------- runtime types */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalAddress = 700,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
} cudaStreamCaptureMode;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
} cudaFuncAttribute;

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1

typedef struct eisim_stream *cudaStream_t;
typedef struct eisim_graph *cudaGraph_t;
typedef struct eisim_graph *cudaGraphExec_t;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock, sharedMemPerBlockOptin;
    int major, minor;
    int multiProcessorCount;
    int integrated;
    int maxThreadsPerBlock;
};

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s = 0);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *ex, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t ex, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t ex);

/* ---------------------------------------------------------------- the simulator's interface */
namespace eisim {
struct ThreadCtx {
    uint3 tid;
    unsigned lane;
};
struct BlockCtx {
    uint3 idx;
    dim3 dim, grid;
    unsigned char *dyn_smem;
};
/* Not initial-exec TLS, though it would be cheaper: that marks the whole library
 * (every __shared__ array included) for the static TLS block, whose small surplus
 * other dlopen'ed libraries need (libgomp, under llama-cpp-python, then fails to load). */
#define EISIM_TLS thread_local
extern EISIM_TLS ThreadCtx *t_thread;   /* the CUDA thread running on this OS thread */
extern EISIM_TLS const BlockCtx *t_block;
inline ThreadCtx *self() { return t_thread; }
inline const BlockCtx *block() { return t_block; }
void sync_block();
/* The value of lane src_lane (the caller's own when src_lane is outside the warp),
 * once every lane of mask has arrived. */
uint64_t shuffle(unsigned mask, uint64_t bits, int src_lane);
cudaError_t set_func_attribute(const void *func, cudaFuncAttribute attr, int value);
cudaError_t launch(const char *name, const void *func, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   std::function<void()> body);

template <class T>
T *dynamic_shared() {
    return reinterpret_cast<T *>(block()->dyn_smem);
}

template <class T>
struct same {
    typedef T type;
};

/* `name<<<grid, block, smem, stream>>>(args)` is rewritten to
 * `eisim::kernel("name")(grid, block, smem, stream)(name, args)`; arguments convert
 * to the kernel's parameter types at the call, as they would for the real launch,
 * and are copied into the launch (a captured graph keeps these values). */
struct configured {
    const char *name;
    dim3 grid, blk;
    size_t smem;
    cudaStream_t stream;
    template <class... P>
    void operator()(void (*k)(P...), typename same<P>::type... a) const {
        std::tuple<typename std::decay<P>::type...> args(a...);
        launch(name, reinterpret_cast<const void *>(k), grid, blk, smem, stream, [k, args]() { std::apply(k, args); });
    }
};
struct kernel {
    const char *name;
    explicit kernel(const char *n) : name(n) {}
    configured operator()(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = 0) const {
        return configured{name, g, b, smem, s};
    }
};
}  // namespace eisim

template <class F>
cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value) {
    return eisim::set_func_attribute(reinterpret_cast<const void *>(func), attr, value);
}

#define threadIdx (eisim::self()->tid)
#define blockIdx (eisim::block()->idx)
#define blockDim (eisim::block()->dim)
#define gridDim (eisim::block()->grid)
#define warpSize 32

inline void __syncthreads() { eisim::sync_block(); }

template <class T>
inline T eisim_shfl(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a value over 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = eisim::shuffle(mask, bits, src);
    memcpy(&v, &bits, sizeof v);
    return v;
}
/* Lanes are grouped in segments of `width`; a source outside the caller's segment
 * yields the caller's own value (xor, down) or wraps within it (idx). */
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = (int)eisim::self()->lane, src = lane ^ lane_mask;
    return eisim_shfl(mask, v, (src / width == lane / width) ? src : lane);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = (int)eisim::self()->lane, src = lane + (int)delta;
    return eisim_shfl(mask, v, (src / width == lane / width) ? src : lane);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    const int lane = (int)eisim::self()->lane;
    return eisim_shfl(mask, v, lane / width * width + ((src_lane % width) + width) % width);
}

/* ---------------------------------------------------------------- device functions */
template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    return a < b ? a : b;
}
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) {
    return a > b ? a : b;
}
template <class T>
inline T __ldg(const T *p) {
    return *p;
}
/* The build fuses a*b+c into an FMA as nvcc does (-ffp-contract=fast), but nvcc never fuses
 * the _rn intrinsics: their operands and result pass through an empty asm, which the
 * compiler cannot see into, so each is rounded on its own. */
inline float eisim_rounded(float v) {
#if defined(__x86_64__)
    __asm__("" : "+x"(v));
#elif defined(__aarch64__)
    __asm__("" : "+w"(v));
#else
    volatile float r = v;
    v = r;
#endif
    return v;
}
inline float __fadd_rn(float a, float b) { return eisim_rounded(eisim_rounded(a) + eisim_rounded(b)); }
inline float __fsub_rn(float a, float b) { return eisim_rounded(eisim_rounded(a) - eisim_rounded(b)); }
inline float __fmul_rn(float a, float b) { return eisim_rounded(eisim_rounded(a) * eisim_rounded(b)); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
template <class To, class From>
inline To eisim_bits(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between sizes");
    To t;
    memcpy(&t, &v, sizeof t);
    return t;
}
inline float __uint_as_float(unsigned u) { return eisim_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return eisim_bits<unsigned>(f); }
inline float __int_as_float(int i) { return eisim_bits<float>(i); }
inline int __float_as_int(float f) { return eisim_bits<int>(f); }
/* Sum of the four signed byte products of a and b, plus c. */
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; i++) c += ((a >> (8 * i)) & 255u) * ((b >> (8 * i)) & 255u);
    return c;
}
/* Blocks run concurrently on OS threads: atomics are real atomics. */
template <class T>
inline T atomicAdd(T *p, T v) {
    if constexpr (std::is_floating_point<T>::value) {
        T old = __atomic_load_n(p, __ATOMIC_RELAXED), next;
        do next = old + v;
        while (!__atomic_compare_exchange(p, &old, &next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return old;
    } else {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    }
}
template <class T>
inline T atomicMax(T *p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
#endif
