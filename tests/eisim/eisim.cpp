/* eisim: the CUDA runtime on the CPU (see include/cuda_runtime.h).
 *
 * Beyond computing what the kernels compute, it checks what a GPU would punish:
 * - a block's warps run independently between barriers, one after another in an order
 *   (EISIM_ORDER: forward, reverse, or random from EISIM_SEED, drawn again at every
 *   barrier, with the lanes of a warp in a random order at each step), so a warp can be
 *   a whole barrier interval ahead of another: a race between them changes the result;
 * - a load or store through a misaligned pointer (a float4 off a 16-byte boundary), which
 *   the build's -fsanitize=alignment reports here: cudaErrorMisalignedAddress, sticky;
 * - launch limits: block <= 1024 threads, grid y/z <= 65535, dynamic shared
 *   memory <= 48 KiB unless the kernel opted in, and never over the simulated
 *   device's limit (EISIM_CC: 75 = T4 64 KiB, 87 = Orin 163 KiB, 90 = H200 227 KiB);
 * - warp shuffles whose mask names a lane that has exited or does not exist, and
 *   barriers some threads never reach (a hang on a GPU): a launch failure;
 * - device memory is poisoned (0xFF bytes: NaN floats) when allocated and so is
 *   dynamic shared memory per block; each allocation ends at a guard page;
 * - device memory is inaccessible to host code (PROT_NONE) except while a stream
 *   operation runs, so host code that dereferences a device pointer faults;
 * - copies and memsets must lie inside one allocation, on the side their kind says;
 * - work on a non-default stream runs only when the host synchronizes with it,
 *   so a result read before cudaStreamSynchronize is stale, as it may be on a GPU;
 * - during stream capture, synchronous calls from the capturing thread fail and
 *   invalidate the capture, as cudaStreamCaptureModeThreadLocal makes them;
 *   a graph replays the launches with the arguments they had at capture.
 * Environment: EISIM_CC (default 90), EISIM_MEM_MB (default 8192),
 * EISIM_INTEGRATED (0), EISIM_THREADS (OS threads for blocks, default all cores),
 * EISIM_PROTECT (1), EISIM_NO_DEVICE (0; 1 = the runtime reports no device),
 * EISIM_ORDER (forward, reverse or random), EISIM_SEED (0; the random order's seed). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_runtime.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace {

/* ---------------------------------------------------------------- configuration */
long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

enum Order { FORWARD, REVERSE, RANDOM };

struct Config {
    int cc = 90;
    size_t mem = (size_t)8192 << 20;
    int integrated = 0, threads = 1, protect = 1, no_device = 0;
    Order order = FORWARD;   /* of a block's warps between barriers, and of a warp's lanes */
    uint64_t seed = 0;
    const char *bad = NULL;   /* a setting the simulator cannot run with: it reports no device */
    size_t smem_optin = 232448;
    Config() {
        cc = (int)env_long("EISIM_CC", 90);
        mem = (size_t)env_long("EISIM_MEM_MB", 8192) << 20;
        integrated = (int)env_long("EISIM_INTEGRATED", 0);
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = (int)env_long("EISIM_THREADS", n > 0 ? n : 1);
        if (threads < 1) threads = 1;
        protect = (int)env_long("EISIM_PROTECT", 1);
        no_device = (int)env_long("EISIM_NO_DEVICE", 0);
        const char *order = getenv("EISIM_ORDER");
        if (order && !strcmp(order, "reverse")) this->order = REVERSE;
        else if (order && !strcmp(order, "random")) this->order = RANDOM;
        else if (order && *order && strcmp(order, "forward")) bad = "EISIM_ORDER must be forward, reverse or random";
        seed = (uint64_t)env_long("EISIM_SEED", 0);
        smem_optin = cc < 80 ? 65536 : cc < 90 ? 166912 : 232448;
    }
};
const Config &cfg() {
    static const Config c;
    return c;
}

/* ---------------------------------------------------------------- errors */
thread_local cudaError_t t_last = cudaSuccess;
std::atomic<int> g_sticky{cudaSuccess};   /* a kernel fault: every later call fails, as on a GPU */

cudaError_t note(cudaError_t e) {
    if (e != cudaSuccess) t_last = e;
    return e;
}
cudaError_t sticky() { return (cudaError_t)g_sticky.load(); }

/* The first fault is printed and sticks; later ones (other blocks, other lanes) add nothing. */
void fault(cudaError_t e, const char *fmt, ...) {
    int expected = cudaSuccess;
    if (!g_sticky.compare_exchange_strong(expected, e)) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "eisim: %s\n", msg);
}

/* ---------------------------------------------------------------- device memory */
struct Alloc {
    unsigned char *map;   /* the mapping: pages, then a guard page */
    size_t map_bytes, size;
};
std::recursive_mutex g_mu;                /* guards everything below and the streams */
std::map<uintptr_t, Alloc> g_allocs;      /* by user pointer */
size_t g_used = 0;
int g_open = 0;                           /* device memory accessible (nesting count) */

size_t page() {
    static const size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

void protect_one(const Alloc &a, bool open) {
    if (cfg().protect) mprotect(a.map, a.map_bytes - page(), open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

/* Device memory is readable by the code running inside this scope only. */
struct DeviceAccess {
    DeviceAccess() {
        std::lock_guard<std::recursive_mutex> l(g_mu);
        if (g_open++ == 0)
            for (auto &kv : g_allocs) protect_one(kv.second, true);
    }
    ~DeviceAccess() {
        std::lock_guard<std::recursive_mutex> l(g_mu);
        if (--g_open == 0)
            for (auto &kv : g_allocs) protect_one(kv.second, false);
    }
};

/* The allocation holding [p, p + n), or NULL. */
const Alloc *find_device(const void *p, size_t n) {
    const uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return NULL;
    --it;
    if (a < it->first || a + n > it->first + it->second.size || a + n < a) return NULL;
    return &it->second;
}
bool touches_device(const void *p, size_t n) {
    const uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a + (n ? n - 1 : 0));
    if (it == g_allocs.begin()) return false;
    --it;
    return it->first + it->second.size > a;
}

/* ---------------------------------------------------------------- fibers: a CUDA thread each */
enum State { RUNNABLE, AT_BARRIER, AT_SHUFFLE, DONE };

struct Fiber {
#if defined(__x86_64__)
    void *sp;
#else
    ucontext_t uc;
#endif
    State state;
    eisim::ThreadCtx ctx;
    unsigned mask;
    int src;
    uint64_t in, out;
};

enum { STACK_BYTES = 128 << 10, MAX_THREADS = 1024, MAX_WARPS = MAX_THREADS / 32 };

/* splitmix64: the random order's generator, seeded per block so a run repeats. */
uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
struct Rng {
    uint64_t s = 0;
    uint64_t next() { return mix(s += 0x9e3779b97f4a7c15ull); }
};

struct Worker {   /* one per OS thread that runs blocks */
    unsigned char *stacks = NULL;   /* MAX_THREADS stacks, each under a guard page */
    std::vector<Fiber> fibers;
#if defined(__x86_64__)
    void *sched_sp = NULL;
#else
    ucontext_t sched;
#endif
    Fiber *cur = NULL;
    int run[32], run_n = 0, run_pos = 0;   /* the lanes of this step, in the order they run */
    int warps[MAX_WARPS];                  /* this barrier interval's order of warps */
    Rng rng;
    const char *kernel = NULL;             /* the running kernel's name */
    eisim::BlockCtx blk{};
    std::vector<unsigned char> dyn;
    const std::function<void()> *body = NULL;
    Worker() {
        stacks = (unsigned char *)mmap(NULL, slot_bytes * MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (stacks == MAP_FAILED) {
            fprintf(stderr, "eisim: cannot map fiber stacks: %s\n", strerror(errno));
            abort();   /* the simulator itself cannot run; not reachable from bad input */
        }
        for (int i = 0; i < MAX_THREADS; i++) mprotect(stacks + i * slot_bytes, page(), PROT_NONE);
        fibers.resize(MAX_THREADS);
    }
    unsigned char *stack_top(int i) const { return stacks + (size_t)(i + 1) * slot_bytes; }
    size_t slot_bytes = STACK_BYTES + page();
};
EISIM_TLS Worker *t_worker = NULL;

Worker &worker() {
    if (!t_worker) t_worker = new Worker();   /* lives as long as its thread; the pool's threads never end */
    return *t_worker;
}

extern "C" void eisim_fiber_main();

#if defined(__x86_64__)
extern "C" void eisim_switch(void **save, void *to);
asm(R"(
.text
.p2align 4
.type eisim_switch,@function
eisim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size eisim_switch, .-eisim_switch
)");

void fiber_init(Worker &w, int i) {
    void **sp = (void **)w.stack_top(i);
    *--sp = NULL;                              /* fake return address: keeps the ABI's alignment */
    *--sp = (void *)eisim_fiber_main;          /* where eisim_switch's ret lands */
    for (int r = 0; r < 6; r++) *--sp = NULL;  /* rbp rbx r12-r15 */
    w.fibers[i].sp = sp;
}
void to_fiber(Worker &w, Fiber &f) { eisim_switch(&w.sched_sp, f.sp); }
void fiber_to_fiber(Fiber &from, Fiber &to) { eisim_switch(&from.sp, to.sp); }
void to_scheduler(Worker &w, Fiber &f) { eisim_switch(&f.sp, w.sched_sp); }
#else
void fiber_init(Worker &w, int i) {
    Fiber &f = w.fibers[i];
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = w.stack_top(i) - STACK_BYTES;
    f.uc.uc_stack.ss_size = STACK_BYTES;
    f.uc.uc_link = NULL;
    makecontext(&f.uc, eisim_fiber_main, 0);
}
void to_fiber(Worker &w, Fiber &f) { swapcontext(&w.sched, &f.uc); }
void fiber_to_fiber(Fiber &from, Fiber &to) { swapcontext(&from.uc, &to.uc); }
void to_scheduler(Worker &w, Fiber &f) { swapcontext(&f.uc, &w.sched); }
#endif

/* The fiber f stops here: on to the next lane of this step, or back to the scheduler. */
void yield(Worker &w, Fiber &f) {
    if (++w.run_pos < w.run_n) {
        Fiber &g = w.fibers[w.run[w.run_pos]];
        w.cur = &g;
        eisim::t_thread = &g.ctx;
        fiber_to_fiber(f, g);
        return;
    }
    to_scheduler(w, f);
}

/* a[0..n) = 0..n-1 in the configured order. */
void arrange(Worker &w, int *a, int n) {
    for (int i = 0; i < n; i++) a[i] = cfg().order == REVERSE ? n - 1 - i : i;
    if (cfg().order == RANDOM)
        for (int i = n - 1; i > 0; i--) std::swap(a[i], a[w.rng.next() % (uint64_t)(i + 1)]);
}

}  // namespace

extern "C" void eisim_fiber_main() {
    Worker &w = *t_worker;
    (*w.body)();
    w.cur->state = DONE;
    yield(w, *w.cur);   /* never resumed */
}

EISIM_TLS eisim::ThreadCtx *eisim::t_thread = NULL;
EISIM_TLS const eisim::BlockCtx *eisim::t_block = NULL;

void eisim::sync_block() {
    Worker &w = *t_worker;
    w.cur->state = AT_BARRIER;
    yield(w, *w.cur);
}

uint64_t eisim::shuffle(unsigned mask, uint64_t bits, int src_lane) {
    Worker &w = *t_worker;
    Fiber &f = *w.cur;
    f.mask = mask;
    f.in = bits;
    f.src = src_lane;
    f.state = AT_SHUFFLE;
    yield(w, f);
    return f.out;
}

namespace {

/* Releases the warp of lanes [base, base + lanes) once all of them have reached a shuffle
 * (or exited): *released. false + *bad when its shuffle can never complete (the mask names
 * a lane that exited or does not exist). */
bool release_shuffle(Worker &w, int base, int lanes, bool *released, const char **bad) {
    Fiber *f = &w.fibers[base];
    uint32_t arrived = 0;
    for (int l = 0; l < lanes; l++) {
        if (f[l].state == AT_SHUFFLE) arrived |= 1u << l;
        else if (f[l].state != DONE) return true;
    }
    if (!arrived) return true;
    const uint32_t exists = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    for (int l = 0; l < lanes; l++) {
        if (!(arrived >> l & 1u) || !(f[l].mask & ~arrived)) continue;
        *bad = (f[l].mask & ~exists) ? "a warp shuffle's mask names a lane past the end of the block"
                                     : "a warp shuffle's mask names a lane that has exited";
        return false;
    }
    for (int l = 0; l < lanes; l++) {
        if (f[l].state != AT_SHUFFLE) continue;
        const int s = f[l].src;
        f[l].out = (s >= 0 && s < lanes && f[s].state == AT_SHUFFLE) ? f[s].in : f[l].in;
    }
    for (int l = 0; l < lanes; l++)
        if (f[l].state == AT_SHUFFLE) f[l].state = RUNNABLE;
    *released = true;
    return true;
}

/* Runs the runnable lanes of the warp [base, base + lanes) once each, in the configured
 * order, until each reaches a barrier, a shuffle or its end; false when none could run. */
bool step_warp(Worker &w, int base, int lanes) {
    int order[32];
    arrange(w, order, lanes);
    w.run_n = 0;
    for (int l = 0; l < lanes; l++)
        if (w.fibers[base + order[l]].state == RUNNABLE) w.run[w.run_n++] = base + order[l];
    if (!w.run_n) return false;
    w.run_pos = 0;
    w.cur = &w.fibers[w.run[0]];
    eisim::t_thread = &w.cur->ctx;
    to_fiber(w, *w.cur);
    return true;
}

/* Runs one block to completion; false after a fault. Between two barriers the warps run
 * one after another, each as far as it can (shuffles only wait for the warp's own lanes). */
bool run_block(Worker &w, const char *name, uint3 idx, dim3 bd, dim3 gd, size_t smem, uint64_t seed) {
    const int n = (int)(bd.x * bd.y * bd.z), n_warps = (n + 31) / 32;
    w.blk.idx = idx;
    w.blk.dim = bd;
    w.blk.grid = gd;
    if (w.dyn.size() < smem + 16) w.dyn.resize(smem + 16);
    memset(w.dyn.data(), 0xff, smem);   /* uninitialized shared memory reads as NaN */
    w.blk.dyn_smem = w.dyn.data();
    eisim::t_block = &w.blk;
    w.kernel = name;
    w.rng.s = seed;
    for (int i = 0; i < n; i++) {
        Fiber &f = w.fibers[i];
        f.state = RUNNABLE;
        f.ctx.tid = bd.y == 1 && bd.z == 1 ? uint3{(unsigned)i, 0, 0} : uint3{i % bd.x, i / bd.x % bd.y, i / (bd.x * bd.y)};
        f.ctx.lane = (unsigned)(i % 32);
        fiber_init(w, i);
    }
    const char *bad = NULL;
    for (;;) {
        arrange(w, w.warps, n_warps);
        for (int p = 0; p < n_warps && !bad; p++) {
            const int base = w.warps[p] * 32, lanes = n - base < 32 ? n - base : 32;
            bool released = true;
            while (released && step_warp(w, base, lanes)) {
                released = false;
                if (!release_shuffle(w, base, lanes, &released, &bad)) break;
            }
        }
        eisim::t_thread = NULL;   /* host code again (the alignment handler tells them apart) */
        if (bad) {
            fault(cudaErrorLaunchFailure, "kernel %s, block (%u,%u,%u): %s", name, idx.x, idx.y, idx.z, bad);
            return false;
        }
        int waiting = 0, done = 0;
        for (int i = 0; i < n; i++) {
            waiting += w.fibers[i].state == AT_BARRIER;
            done += w.fibers[i].state == DONE;
        }
        if (done == n) return true;
        if (waiting + done < n) {
            fault(cudaErrorLaunchFailure,
                  "kernel %s, block (%u,%u,%u): threads wait at different barriers (__syncthreads in divergent "
                  "code or a shuffle and a barrier at once): this hangs a GPU", name, idx.x, idx.y, idx.z);
            return false;
        }
        for (int i = 0; i < n; i++)   /* threads that exited count as arrived, as on Volta and later */
            if (w.fibers[i].state == AT_BARRIER) w.fibers[i].state = RUNNABLE;
    }
}

/* ---------------------------------------------------------------- the block pool */
struct Pool {
    std::mutex mu;
    std::condition_variable cv, done_cv;
    std::vector<std::thread> threads;
    const std::function<void()> *job = NULL;
    uint64_t generation = 0;
    int busy = 0;

    explicit Pool(int n) {
        for (int i = 0; i < n; i++) threads.emplace_back([this] { loop(); });
        for (auto &t : threads) t.detach();
    }
    void loop() {
        uint64_t seen = 0;
        for (;;) {
            std::unique_lock<std::mutex> l(mu);
            cv.wait(l, [&] { return generation != seen; });
            seen = generation;
            const std::function<void()> *j = job;
            l.unlock();
            (*j)();
            l.lock();
            if (--busy == 0) done_cv.notify_all();
        }
    }
    /* Runs f on the caller and on every pool thread; returns when all are done. */
    void run(const std::function<void()> &f) {
        {
            std::lock_guard<std::mutex> l(mu);
            job = &f;
            busy = (int)threads.size();
            generation++;
        }
        cv.notify_all();
        f();
        std::unique_lock<std::mutex> l(mu);
        done_cv.wait(l, [&] { return busy == 0; });
    }
};
Pool &pool() {
    static Pool *p = new Pool(cfg().threads - 1);   /* never destroyed: its threads outlive static destructors */
    return *p;
}

std::atomic<uint64_t> g_launches{0};   /* numbers the launches: each block's random order is its own */

void run_grid(const char *name, dim3 gd, dim3 bd, size_t smem, const std::function<void()> &body) {
    const uint64_t total = (uint64_t)gd.x * gd.y * gd.z, launch = g_launches++;
    std::atomic<uint64_t> next{0};
    std::atomic<bool> failed{false};
    std::function<void()> part = [&] {
        Worker &w = worker();
        w.body = &body;
        for (uint64_t b; !failed.load() && !sticky() && (b = next.fetch_add(1)) < total;) {
            const uint3 idx{(unsigned)(b % gd.x), (unsigned)(b / gd.x % gd.y), (unsigned)(b / ((uint64_t)gd.x * gd.y))};
            const uint64_t seed = mix(cfg().seed ^ mix(launch ^ mix(b)));
            if (!run_block(w, name, idx, bd, gd, smem, seed)) failed = true;
        }
    };
    if (total > 1 && cfg().threads > 1) pool().run(part);
    else part();
}

/* ---------------------------------------------------------------- streams and graphs */
/* A stream operation; a copy names the device range it touches, so that it
 * opens only those pages (a kernel opens all device memory). */
struct Op {
    std::function<void()> fn;
    void *range = NULL;
    size_t bytes = 0;
};

}  // namespace

struct eisim_stream {
    unsigned flags = 0;
    std::vector<Op> pending;
    cudaGraph_t capture = NULL;   /* the graph being captured, if any */
    bool invalidated = false;
};
struct eisim_graph {
    std::vector<Op> ops;
};

namespace {
std::vector<eisim_stream *> g_streams;
thread_local eisim_stream *t_capturing = NULL;   /* the stream this thread captures into */

void open_range(void *p, size_t n, bool open) {
    if (!cfg().protect || !n) return;
    const uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(page() - 1), hi = ((uintptr_t)p + n + page() - 1) & ~(uintptr_t)(page() - 1);
    mprotect((void *)lo, hi - lo, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

void run_ops(std::vector<Op> &ops) {
    if (ops.empty()) return;
    if (ops.size() == 1 && ops[0].range && !g_open) {   /* one copy: open just its pages */
        open_range(ops[0].range, ops[0].bytes, true);
        if (sticky() == cudaSuccess) ops[0].fn();
        open_range(ops[0].range, ops[0].bytes, false);
    } else {
        DeviceAccess open;
        for (auto &op : ops)
            if (sticky() == cudaSuccess) op.fn();
    }
    ops.clear();
}

/* Work on the legacy default stream runs at once; other streams run when the host waits. */
void enqueue(cudaStream_t s, Op op) {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if (s && s->capture) {
        s->capture->ops.push_back(std::move(op));
        return;
    }
    if (s) {
        s->pending.push_back(std::move(op));
        return;
    }
    /* the legacy stream first waits for the blocking streams (not the non-blocking ones) */
    for (auto *x : g_streams)
        if (!(x->flags & cudaStreamNonBlocking) && !x->capture) run_ops(x->pending);
    std::vector<Op> one{std::move(op)};
    run_ops(one);
}

bool known_stream(cudaStream_t s) {
    if (!s) return true;
    std::lock_guard<std::recursive_mutex> l(g_mu);
    for (auto *x : g_streams)
        if (x == s) return true;
    return false;
}

/* A synchronous call during this thread's capture: it fails and spoils the capture. */
bool refuse_in_capture() {
    if (!t_capturing) return false;
    t_capturing->invalidated = true;
    return true;
}

std::map<const void *, int> g_func_smem;   /* cudaFuncAttributeMaxDynamicSharedMemorySize per kernel */
}  // namespace

cudaError_t eisim::set_func_attribute(const void *func, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
    if (value < 0 || (size_t)value > cfg().smem_optin) return note(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> l(g_mu);
    g_func_smem[func] = value;
    return cudaSuccess;
}

cudaError_t eisim::launch(const char *name, const void *func, dim3 grid, dim3 blk, size_t smem, cudaStream_t s,
                          std::function<void()> body) {
    if (sticky()) return note(sticky());
    if (cfg().bad) return note(cudaErrorInitializationError);
    const uint64_t threads = (uint64_t)blk.x * blk.y * blk.z;
    if (!threads || threads > MAX_THREADS || blk.z > 64 || !grid.x || !grid.y || !grid.z || grid.y > 65535 ||
        grid.z > 65535 || grid.x > 0x7fffffffu) {
        fprintf(stderr, "eisim: kernel %s: bad launch configuration grid (%u,%u,%u) block (%u,%u,%u)\n", name, grid.x,
                grid.y, grid.z, blk.x, blk.y, blk.z);
        return note(cudaErrorInvalidConfiguration);
    }
    if (!known_stream(s)) return note(cudaErrorInvalidResourceHandle);
    if (smem > 48 * 1024) {
        std::lock_guard<std::recursive_mutex> l(g_mu);
        auto it = g_func_smem.find(func);
        if (it == g_func_smem.end() || (size_t)it->second < smem) {
            fprintf(stderr, "eisim: kernel %s: %zu bytes of dynamic shared memory without opting in to them\n", name, smem);
            return note(cudaErrorInvalidValue);
        }
    }
    enqueue(s, Op{[name, grid, blk, smem, body] { run_grid(name, grid, blk, smem, body); }});
    return cudaSuccess;
}

/* ---------------------------------------------------------------- misaligned access */
/* -fsanitize=alignment (scripts/build_cuda_sim.sh) calls this for a load or store through a
 * pointer not aligned to its type (the layouts are those of GCC's UBSan runtime, which the
 * build does not link). A GPU faults on such an access: inside a kernel it is a sticky
 * cudaErrorMisalignedAddress naming the kernel, thread and source line. */
struct UbsanLocation {
    const char *file;
    uint32_t line, column;
};
struct UbsanType {
    uint16_t kind, info;
    char name[1];
};
struct UbsanTypeMismatch {
    UbsanLocation loc;
    const UbsanType *type;
    unsigned char log_alignment, check_kind;
};

extern "C" __attribute__((visibility("default"))) void __ubsan_handle_type_mismatch_v1(UbsanTypeMismatch *d,
                                                                                       uintptr_t ptr) {
    static const char *const what[] = {"load of", "store to", "reference binding to", "member access within",
                                       "member call on", "constructor call on"};
    const char *access = d->check_kind < sizeof what / sizeof *what ? what[d->check_kind] : "access to";
    const unsigned align = 1u << d->log_alignment;
    const eisim::ThreadCtx *th = eisim::t_thread;
    if (!th) {   /* host code: undefined behaviour in our own C++, not a device fault */
        fprintf(stderr, "eisim: host code at %s:%u: %s misaligned address %p for type %s, which needs %u-byte alignment\n",
                d->loc.file, d->loc.line, access, (void *)ptr, d->type->name, align);
        abort();
    }
    const eisim::BlockCtx *b = eisim::t_block;
    fault(cudaErrorMisalignedAddress,
          "kernel %s, block (%u,%u,%u), thread (%u,%u,%u) at %s:%u: %s misaligned address %p for type %s, which needs "
          "%u-byte alignment", t_worker->kernel, b->idx.x, b->idx.y, b->idx.z, th->tid.x, th->tid.y, th->tid.z,
          d->loc.file, d->loc.line, access, (void *)ptr, d->type->name, align);
}

/* ---------------------------------------------------------------- the runtime API */
cudaError_t cudaGetLastError(void) {
    const cudaError_t e = sticky() ? sticky() : t_last;
    t_last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return sticky() ? sticky() : t_last; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    }
    return "cudaErrorUnknown";
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (EISIM_NO_DEVICE)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (the simulator printed why on stderr)";
    case cudaErrorMisalignedAddress: return "misaligned address (the simulator printed where on stderr)";
    case cudaErrorInitializationError: return cfg().bad ? cfg().bad : "initialization error";
    case cudaErrorMemoryAllocation: return "out of memory";
    default: return cudaGetErrorName(e);
    }
}

cudaError_t cudaDriverGetVersion(int *v) {
    if (!v) return note(cudaErrorInvalidValue);
    *v = 13000;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v) return note(cudaErrorInvalidValue);
    *v = 13000;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n) {
    if (!n) return note(cudaErrorInvalidValue);
    *n = 0;
    if (cfg().bad) return note(cudaErrorInitializationError);
    if (cfg().no_device) return note(cudaErrorNoDevice);
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    if (!d) return note(cudaErrorInvalidValue);
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (cfg().no_device) return note(cudaErrorNoDevice);
    return d == 0 ? cudaSuccess : note(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (!p) return note(cudaErrorInvalidValue);
    if (cfg().no_device) return note(cudaErrorNoDevice);
    if (d != 0) return note(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "eisim CUDA simulator (sm_%d, on the CPU)", cfg().cc);
    p->totalGlobalMem = cfg().mem;
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = cfg().smem_optin;
    p->major = cfg().cc / 10;
    p->minor = cfg().cc % 10;
    p->multiProcessorCount = cfg().threads;
    p->integrated = cfg().integrated;
    p->maxThreadsPerBlock = MAX_THREADS;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    if (!free_bytes || !total_bytes) return note(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> l(g_mu);
    *total_bytes = cfg().mem;
    *free_bytes = cfg().mem - g_used;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **out, size_t n) {
    if (!out) return note(cudaErrorInvalidValue);
    *out = NULL;
    if (refuse_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
    if (sticky()) return note(sticky());
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if (n == 0) return cudaSuccess;
    const size_t user = (n + 255) & ~(size_t)255;
    if (user > cfg().mem - g_used) return note(cudaErrorMemoryAllocation);
    const size_t body = (user + page() - 1) / page() * page();
    Alloc a;
    a.map_bytes = body + page();
    a.size = n;
    a.map = (unsigned char *)mmap(NULL, a.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a.map == MAP_FAILED) return note(cudaErrorMemoryAllocation);
    mprotect(a.map + body, page(), PROT_NONE);   /* the guard page */
    unsigned char *p = a.map + body - user;      /* 256-aligned, ending at the guard page */
    memset(p, 0xff, user);                       /* fresh device memory holds garbage: NaN here */
    g_allocs[(uintptr_t)p] = a;
    g_used += user;
    if (!g_open) protect_one(a, false);
    *out = p;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    if (refuse_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
    std::lock_guard<std::recursive_mutex> l(g_mu);
    for (auto *s : g_streams) run_ops(s->pending);   /* cudaFree waits for the device */
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end()) return note(cudaErrorInvalidValue);
    g_used -= (it->second.size + 255) & ~(size_t)255;
    munmap(it->second.map, it->second.map_bytes);
    g_allocs.erase(it);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    if (!p) return note(cudaErrorInvalidValue);
    if (refuse_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
    *p = n ? malloc(n) : NULL;
    return (*p || !n) ? cudaSuccess : note(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}

namespace {
/* The sides of a copy must be what its kind says, inside one allocation. */
cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) return cudaErrorInvalidValue;
    if (dst_dev ? !find_device(dst, n) : touches_device(dst, n)) return cudaErrorInvalidValue;
    if (src_dev ? !find_device(src, n) : touches_device(src, n)) return cudaErrorInvalidValue;
    return cudaSuccess;
}
Op copy_op(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    void *dev = kind == cudaMemcpyHostToDevice ? dst : kind == cudaMemcpyDeviceToHost ? (void *)src : NULL;
    return Op{[=] { memcpy(dst, src, n); }, dev, dev ? n : 0};
}
}  // namespace

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    if (refuse_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
    if (sticky()) return note(sticky());
    if (!n) return cudaSuccess;
    if (check_copy(dst, src, n, kind)) {
        fprintf(stderr, "eisim: cudaMemcpy of %zu bytes (kind %d) outside device allocations or on the wrong side\n", n, (int)kind);
        return note(cudaErrorInvalidValue);
    }
    enqueue(0, copy_op(dst, src, n, kind));
    return sticky() ? note(sticky()) : cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
    if (sticky()) return note(sticky());
    if (!known_stream(s)) return note(cudaErrorInvalidResourceHandle);
    if (!n) return cudaSuccess;
    if (check_copy(dst, src, n, kind)) {
        fprintf(stderr, "eisim: cudaMemcpyAsync of %zu bytes (kind %d) outside device allocations or on the wrong side\n", n, (int)kind);
        return note(cudaErrorInvalidValue);
    }
    enqueue(s, copy_op(dst, src, n, kind));
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    if (sticky()) return note(sticky());
    if (!known_stream(s)) return note(cudaErrorInvalidResourceHandle);
    if (!n) return cudaSuccess;
    {
        std::lock_guard<std::recursive_mutex> l(g_mu);
        if (!find_device(p, n)) {
            fprintf(stderr, "eisim: cudaMemset of %zu bytes outside device allocations\n", n);
            return note(cudaErrorInvalidValue);
        }
    }
    enqueue(s, Op{[=] { memset(p, v, n); }, p, n});
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    if (refuse_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
    return cudaMemsetAsync(p, v, n, 0);
}

cudaError_t cudaDeviceSynchronize(void) {
    if (refuse_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
    std::lock_guard<std::recursive_mutex> l(g_mu);
    for (auto *s : g_streams) run_ops(s->pending);
    return sticky() ? note(sticky()) : cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    if (!s) return note(cudaErrorInvalidValue);
    if (cfg().no_device) return note(cudaErrorNoDevice);
    std::lock_guard<std::recursive_mutex> l(g_mu);
    *s = new eisim_stream();
    (*s)->flags = flags;
    g_streams.push_back(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if (!s || !known_stream(s)) return note(cudaErrorInvalidResourceHandle);
    run_ops(s->pending);   /* destroying a stream lets its queued work finish */
    for (size_t i = 0; i < g_streams.size(); i++)
        if (g_streams[i] == s) g_streams.erase(g_streams.begin() + (long)i);
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (refuse_in_capture()) return note(cudaErrorStreamCaptureUnsupported);
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if (!known_stream(s)) return note(cudaErrorInvalidResourceHandle);
    if (s) run_ops(s->pending);
    return sticky() ? note(sticky()) : cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if (!s) return note(cudaErrorStreamCaptureUnsupported);   /* the legacy stream cannot be captured */
    if (!known_stream(s) || s->capture || t_capturing) return note(cudaErrorInvalidValue);
    run_ops(s->pending);   /* what was queued before the capture is not part of it */
    s->capture = new eisim_graph();
    s->invalidated = false;
    t_capturing = s;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    std::lock_guard<std::recursive_mutex> l(g_mu);
    if (!s || !g || !s->capture || t_capturing != s) return note(cudaErrorInvalidValue);
    t_capturing = NULL;
    cudaGraph_t graph = s->capture;
    s->capture = NULL;
    if (s->invalidated) {
        delete graph;
        *g = NULL;
        return note(cudaErrorStreamCaptureInvalidated);
    }
    *g = graph;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *ex, cudaGraph_t g, unsigned long long) {
    if (!ex || !g) return note(cudaErrorInvalidValue);
    *ex = new eisim_graph(*g);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t ex, cudaStream_t s) {
    if (!ex) return note(cudaErrorInvalidValue);
    if (sticky()) return note(sticky());
    if (!known_stream(s)) return note(cudaErrorInvalidResourceHandle);
    for (const Op &op : ex->ops) enqueue(s, op);
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t ex) {
    delete ex;
    return cudaSuccess;
}
