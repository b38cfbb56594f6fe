/* Kernels that break CUDA's rules on purpose, one per check eisim claims to
 * make (tests/test_cuda_sim.py calls these through cffi). Each returns the
 * cudaError_t the host sees, or a value computed on the device. */
#include <cuda_runtime.h>
#include <stdint.h>

#define EXPORT extern "C" __attribute__((visibility("default")))

__global__ void warp_sum_kernel(const float *x, float *out) {
    float v = x[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) out[threadIdx.x / 32] = v;
}

/* Half the warp returns, then the rest shuffles with a full mask: a hang or garbage on a GPU. */
__global__ void shuffle_after_exit_kernel(float *out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

/* Odd lanes wait at the barrier while even lanes wait in a full-warp shuffle for
 * them: neither can finish (a hang on a GPU). */
__global__ void divergent_barrier_kernel(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x % 2) __syncthreads();
    else v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

/* Each thread reads its neighbour's shared value after a barrier: needs the barrier. */
__global__ void neighbour_kernel(float *out) {
    __shared__ float s[128];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

/* The same without the barrier: a race, whose result depends on the order threads run in. */
__global__ void racy_neighbour_kernel(float *out) {
    extern __shared__ float racy[];
    racy[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = racy[(threadIdx.x + 1) % blockDim.x];
}

__global__ void dynamic_smem_kernel(float *out) {
    extern __shared__ float dyn[];
    dyn[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = dyn[threadIdx.x];
}

/* out[i] = the sum of the float4 at x + offset + 4i: a GPU faults unless x + offset is 16-byte aligned. */
__global__ void float4_sum_kernel(const float *x, int offset, float *out) {
    const float4 v = *(reinterpret_cast<const float4 *>(x + offset) + threadIdx.x);
    out[threadIdx.x] = v.x + v.y + v.z + v.w;
}

/* out[0] = x0 * x1 + x2, which nvcc fuses into one FMA (-fmad=true), and out[1] the same
 * through the _rn intrinsics, which it never fuses. */
__global__ void mul_add_kernel(const float *x, float *out) {
    out[0] = x[0] * x[1] + x[2];
    out[1] = __fadd_rn(__fmul_rn(x[0], x[1]), x[2]);
}

__global__ void add_one_kernel(float *x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

/* out[0..n) = the warp sums of x[0..32n). */
EXPORT int eisim_test_warp_sum(const float *x, int n, float *out) {
    float *dx, *dout;
    if (cudaMalloc((void **)&dx, 32 * n * 4) || cudaMalloc((void **)&dout, n * 4)) return -1;
    cudaMemcpy(dx, x, 32 * n * 4, cudaMemcpyHostToDevice);
    warp_sum_kernel<<<1, 32 * n>>>(dx, dout);
    int e = (int)cudaMemcpy(out, dout, n * 4, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dout);
    return e;
}

EXPORT int eisim_test_shuffle_after_exit(void) {
    float *d;
    if (cudaMalloc((void **)&d, 32 * 4)) return -1;
    shuffle_after_exit_kernel<<<1, 32>>>(d);
    const int e = (int)cudaDeviceSynchronize();
    cudaFree(d);
    return e;
}

EXPORT int eisim_test_divergent_barrier(void) {
    float *d;
    if (cudaMalloc((void **)&d, 64 * 4)) return -1;
    divergent_barrier_kernel<<<1, 64>>>(d);
    const int e = (int)cudaDeviceSynchronize();
    cudaFree(d);
    return e;
}

EXPORT int eisim_test_neighbour(int threads, float *out) {
    float *d;
    if (cudaMalloc((void **)&d, threads * 4)) return -1;
    neighbour_kernel<<<1, threads>>>(d);
    const int e = (int)cudaMemcpy(out, d, threads * 4, cudaMemcpyDeviceToHost);
    cudaFree(d);
    return e;
}

EXPORT int eisim_test_racy_neighbour(int threads, float *out) {
    float *d;
    if (cudaMalloc((void **)&d, threads * 4)) return -1;
    racy_neighbour_kernel<<<1, threads, threads * 4>>>(d);
    const int e = (int)cudaMemcpy(out, d, threads * 4, cudaMemcpyDeviceToHost);
    cudaFree(d);
    return e;
}

/* The launch error of `bytes` of dynamic shared memory, after opting in to optin bytes (0: not). */
EXPORT int eisim_test_dynamic_smem(int bytes, int optin) {
    float *d;
    if (cudaMalloc((void **)&d, 32 * 4)) return -1;
    if (optin) {
        const cudaError_t e = cudaFuncSetAttribute(dynamic_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
        if (e) {
            cudaFree(d);
            return (int)e;
        }
    }
    dynamic_smem_kernel<<<1, 32, (size_t)bytes>>>(d);
    int e = (int)cudaGetLastError();
    if (!e) e = (int)cudaDeviceSynchronize();
    cudaFree(d);
    return e;
}

/* out[0..32) = float4_sum_kernel over x[0..132) read from float `offset` on (0 and 4: aligned). */
EXPORT int eisim_test_float4_load(const float *x, int offset, float *out) {
    float *dx, *dout;
    if (cudaMalloc((void **)&dx, 132 * 4) || cudaMalloc((void **)&dout, 32 * 4)) return -1;
    cudaMemcpy(dx, x, 132 * 4, cudaMemcpyHostToDevice);
    float4_sum_kernel<<<1, 32>>>(dx, offset, dout);
    const int e = (int)cudaMemcpy(out, dout, 32 * 4, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dout);
    return e;
}

EXPORT int eisim_test_mul_add(const float *x, float *out) {
    float *dx, *dout;
    if (cudaMalloc((void **)&dx, 3 * 4) || cudaMalloc((void **)&dout, 2 * 4)) return -1;
    cudaMemcpy(dx, x, 3 * 4, cudaMemcpyHostToDevice);
    mul_add_kernel<<<1, 1>>>(dx, dout);
    const int e = (int)cudaMemcpy(out, dout, 2 * 4, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dout);
    return e;
}

EXPORT int eisim_test_bad_grid(void) {
    float *d;
    if (cudaMalloc((void **)&d, 4)) return -1;
    add_one_kernel<<<dim3(1, 70000), 1>>>(d, 1);
    const int e = (int)cudaGetLastError();
    cudaFree(d);
    return e;
}

/* *seen = x[0] read right after an async copy back, without synchronizing
 * (stale), then *synced = x[0] after cudaStreamSynchronize. */
EXPORT int eisim_test_async_needs_sync(float *seen, float *synced) {
    cudaStream_t s;
    float *d, h = 5.0f;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMalloc((void **)&d, 4)) return -1;
    cudaMemcpyAsync(d, &h, 4, cudaMemcpyHostToDevice, s);
    add_one_kernel<<<1, 32, 0, s>>>(d, 1);
    float back = -1.0f;
    cudaMemcpyAsync(&back, d, 4, cudaMemcpyDeviceToHost, s);
    *seen = back;
    const int e = (int)cudaStreamSynchronize(s);
    *synced = back;
    cudaFree(d);
    cudaStreamDestroy(s);
    return e;
}

/* A graph of add_one replayed `replays` times on x = 0; a synchronous copy
 * inside the capture (when spoil) must fail and invalidate it. Returns the
 * EndCapture error, *out the final value. */
EXPORT int eisim_test_graph(int replays, int spoil, float *out) {
    cudaStream_t s;
    float *d, zero = 0.0f, h = 0.0f;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMalloc((void **)&d, 4)) return -1;
    cudaMemcpy(d, &zero, 4, cudaMemcpyHostToDevice);
    cudaGraph_t g = NULL;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    add_one_kernel<<<1, 32, 0, s>>>(d, 1);
    if (spoil && cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost) == cudaSuccess) return -2;
    const int e = (int)cudaStreamEndCapture(s, &g);
    if (!e) {
        cudaGraphExec_t ex;
        cudaGraphInstantiate(&ex, g, 0);
        for (int i = 0; i < replays; i++) cudaGraphLaunch(ex, s);
        cudaStreamSynchronize(s);
        cudaGraphExecDestroy(ex);
        cudaGraphDestroy(g);
    }
    cudaMemcpy(out, d, 4, cudaMemcpyDeviceToHost);
    cudaFree(d);
    cudaStreamDestroy(s);
    return e;
}

/* A copy past the end of an allocation. */
EXPORT int eisim_test_copy_overrun(void) {
    float *d, h[9] = {0};
    if (cudaMalloc((void **)&d, 8 * 4)) return -1;
    const int e = (int)cudaMemcpy(d, h, 9 * 4, cudaMemcpyHostToDevice);
    cudaFree(d);
    return e;
}

/* Reads fresh device memory: NaN, as garbage would be on a GPU. */
EXPORT int eisim_test_fresh_memory(float *out) {
    float *d;
    if (cudaMalloc((void **)&d, 4)) return -1;
    const int e = (int)cudaMemcpy(out, d, 4, cudaMemcpyDeviceToHost);
    cudaFree(d);
    return e;
}

/* The host reads device memory directly: a segfault on a GPU system, and here. */
EXPORT float eisim_test_host_deref(void) {
    float *d;
    if (cudaMalloc((void **)&d, 4)) return -1;
    return *(volatile float *)d;
}
