"""eisim, the CPU simulator of the CUDA runtime (tests/eisim), and the CUDA
backend's own tests run through it on a machine without a GPU.

- The simulator's checks: each kernel of tests/eisim/selftest.cu breaks one
  CUDA rule and must fail the way a GPU would (a kernel fault is sticky in CUDA,
  so every case runs in a fresh process).
- tests/test_cuda.py in a subprocess with EDGEINFER_CUDA_LIB set to the simulator
  build of native/cuda (with the test ops of tests/cuda_ops): every per-op test in
  three thread orders, and the end-to-end tests, run the real kernels.
- The simulator catches a real race: native/cuda with one barrier of the top-k
  kernel deleted must fail the top-k tests.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import cffi
import pytest

import edgeinfer

ROOT = Path(__file__).resolve().parent.parent


def _build(out: Path, src: Path | None = None) -> Path:
    env = dict(os.environ, EDGEINFER_CUDA_SIM_OUT=str(out), PYTHON=sys.executable)
    if src is not None:
        env["EDGEINFER_CUDA_SRC"] = str(src)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "build_cuda_sim.sh")], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.fixture(scope="module")
def sim_build(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("cuda_sim"))


def _case(sim_build: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    """Runs body with `lib` (the self-test library) and `ffi` in a fresh Python."""
    code = textwrap.dedent("""
        import cffi, math
        ffi = cffi.FFI()
        ffi.cdef('''
            int eisim_test_warp_sum(const float *x, int n, float *out);
            int eisim_test_shuffle_after_exit(void);
            int eisim_test_divergent_barrier(void);
            int eisim_test_neighbour(int threads, float *out);
            int eisim_test_racy_neighbour(int threads, float *out);
            int eisim_test_dynamic_smem(int bytes, int optin);
            int eisim_test_float4_load(const float *x, int offset, float *out);
            int eisim_test_mul_add(const float *x, float *out);
            int eisim_test_bad_grid(void);
            int eisim_test_async_needs_sync(float *seen, float *synced);
            int eisim_test_graph(int replays, int spoil, float *out);
            int eisim_test_copy_overrun(void);
            int eisim_test_fresh_memory(float *out);
            float eisim_test_host_deref(void);
        ''')
        lib = ffi.dlopen(%r)
    """ % str(sim_build / "libeisim_selftest.so")) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=120)


def _ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


LAUNCH_FAILURE, MISALIGNED, INVALID_VALUE, INVALID_CONFIGURATION, CAPTURE_INVALIDATED = 719, 716, 1, 9, 901


def test_warp_shuffles_exchange_lane_values(sim_build):
    out = _ok(_case(sim_build, """
        x = ffi.new("float[96]", list(range(96)))
        out = ffi.new("float[3]")
        assert lib.eisim_test_warp_sum(x, 3, out) == 0
        print(list(out))
    """))
    assert out.strip() == str([float(sum(range(32 * w, 32 * w + 32))) for w in range(3)])


@pytest.mark.parametrize("threads", [32, 96, 128])
def test_barrier_orders_shared_memory(sim_build, threads):
    out = _ok(_case(sim_build, f"""
        out = ffi.new("float[{threads}]")
        assert lib.eisim_test_neighbour({threads}, out) == 0
        print(list(out))
    """))
    assert out.strip() == str([float((i + 1) % threads) for i in range(threads)])


@pytest.mark.parametrize("order", ["forward", "reverse", "random"])
def test_barrier_orders_shared_memory_in_every_thread_order(sim_build, order):
    out = _ok(_case(sim_build, """
        out = ffi.new("float[64]")
        assert lib.eisim_test_neighbour(64, out) == 0
        print(list(out))
    """, EISIM_ORDER=order))
    assert out.strip() == str([float((i + 1) % 64) for i in range(64)])


def test_a_race_shows_as_results_that_depend_on_thread_order(sim_build):
    body = """
        out = ffi.new("float[64]")
        assert lib.eisim_test_racy_neighbour(64, out) == 0
        print(list(out))
    """
    runs = {(order, seed): _ok(_case(sim_build, body, EISIM_ORDER=order, EISIM_SEED=seed))
            for order, seed in [("forward", "0"), ("reverse", "0"), ("random", "1"), ("random", "2")]}
    assert runs["forward", "0"] != runs["reverse", "0"] and "nan" in runs["forward", "0"]   # read before written
    assert runs["random", "1"] != runs["random", "2"]   # the seed picks the order
    assert runs["random", "1"] == _ok(_case(sim_build, body, EISIM_ORDER="random", EISIM_SEED="1"))   # and repeats


def test_an_unknown_thread_order_is_refused_with_the_reason(sim_build):
    r = subprocess.run([sys.executable, "-c", "from edgeinfer.backends import cuda as cb; print(cb.probe()[1])"],
                       env=dict(os.environ, EISIM_ORDER="sideways",
                                EDGEINFER_CUDA_LIB=str(sim_build / "libedgeinfer_cuda_sim.so")),
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "EISIM_ORDER must be forward, reverse or random" in _ok(r)


def test_the_cuda_library_has_the_package_version(sim_build):
    """edgeinfer/_version.py is the one place: CMake compiles it into ei_cuda_version() too."""
    ffi = cffi.FFI()
    ffi.cdef("const char *ei_cuda_version(void);")
    lib = ffi.dlopen(str(sim_build / "libedgeinfer_cuda_sim.so"))
    assert ffi.string(lib.ei_cuda_version()).decode() == f"edgeinfer-cuda {edgeinfer.__version__}"


def test_multiply_adds_fuse_as_nvcc_fuses_them(sim_build):
    """a*b + c is one FMA on the device (nvcc -fmad=true), the _rn intrinsics never are:
    (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 fused, 0 rounded twice."""
    out = _ok(_case(sim_build, """
        x = ffi.new("float[3]", [1 + 2**-12, 1 + 2**-12, -(1 + 2**-11)])
        out = ffi.new("float[2]")
        assert lib.eisim_test_mul_add(x, out) == 0
        print(out[0] == 2**-24, out[1] == 0.0)
    """))
    assert out.split() == ["True", "True"]


def test_a_misaligned_vector_load_is_a_device_fault(sim_build):
    body = """
        x = ffi.new("float[132]", list(range(132)))
        out = ffi.new("float[32]")
        print(lib.eisim_test_float4_load(x, %d, out), out[0], out[31])
    """
    for offset in (0, 4):   # 16-byte aligned: the sums of four consecutive floats
        first, last = 4 * offset + 6, 4 * (offset + 124) + 6
        assert _ok(_case(sim_build, body % offset)).split() == ["0", f"{first}.0", f"{last}.0"]
    r = _case(sim_build, body % 1)
    assert _ok(r).split()[0] == str(MISALIGNED)
    assert "float4_sum_kernel" in r.stderr and "misaligned address" in r.stderr and "16-byte" in r.stderr


def test_shuffle_with_exited_lanes_is_a_launch_failure(sim_build):
    r = _case(sim_build, "print(lib.eisim_test_shuffle_after_exit())")
    assert _ok(r).strip() == str(LAUNCH_FAILURE) and "exited" in r.stderr


def test_divergent_barrier_is_a_launch_failure(sim_build):
    r = _case(sim_build, "print(lib.eisim_test_divergent_barrier())")
    assert _ok(r).strip() == str(LAUNCH_FAILURE) and "barriers" in r.stderr


@pytest.mark.parametrize("cc,bytes_,optin,expected", [
    (90, 32 * 1024, 0, 0),                  # under the default 48 KiB
    (90, 64 * 1024, 0, INVALID_VALUE),      # over it without opting in
    (90, 64 * 1024, 64 * 1024, 0),
    (75, 96 * 1024, 96 * 1024, INVALID_VALUE),   # a T4 allows at most 64 KiB
    (87, 96 * 1024, 96 * 1024, 0),
])
def test_dynamic_shared_memory_limits(sim_build, cc, bytes_, optin, expected):
    r = _case(sim_build, f"print(lib.eisim_test_dynamic_smem({bytes_}, {optin}))", EISIM_CC=str(cc))
    assert _ok(r).strip() == str(expected)


def test_bad_grid_is_an_invalid_configuration(sim_build):
    assert _ok(_case(sim_build, "print(lib.eisim_test_bad_grid())")).strip() == str(INVALID_CONFIGURATION)


def test_stream_work_lands_only_after_synchronize(sim_build):
    out = _ok(_case(sim_build, """
        seen, synced = ffi.new("float *"), ffi.new("float *")
        assert lib.eisim_test_async_needs_sync(seen, synced) == 0
        print(seen[0], synced[0])
    """))
    assert out.split() == ["-1.0", "6.0"]


def test_graph_replays_and_synchronous_calls_spoil_a_capture(sim_build):
    out = _ok(_case(sim_build, """
        v = ffi.new("float *")
        print(lib.eisim_test_graph(3, 0, v), v[0])
        print(lib.eisim_test_graph(3, 1, v), v[0])
    """))
    assert out.split() == ["0", "3.0", str(CAPTURE_INVALIDATED), "0.0"]


def test_copies_stay_inside_allocations_and_fresh_memory_is_garbage(sim_build):
    out = _ok(_case(sim_build, """
        v = ffi.new("float *")
        print(lib.eisim_test_copy_overrun(), lib.eisim_test_fresh_memory(v), math.isnan(v[0]))
    """))
    assert out.split() == [str(INVALID_VALUE), "0", "True"]


def test_host_code_cannot_read_device_memory(sim_build):
    r = _case(sim_build, "print(lib.eisim_test_host_deref())")
    assert r.returncode == -11, (r.returncode, r.stdout, r.stderr)   # SIGSEGV, as on a GPU system
    r = _case(sim_build, "print(lib.eisim_test_host_deref())", EISIM_PROTECT="0")
    assert r.returncode == 0 and r.stdout.strip() == "nan"


def _pytest_cuda(sim_build: Path, select: str, test_file: str = "test_cuda.py",
                 **env: str) -> tuple[int, dict[str, int], str]:
    """tests/<test_file> -k select on the simulator build: exit status, the counts of its
    summary line, and the tail of its output."""
    env = dict(os.environ, EDGEINFER_CUDA_LIB=str(sim_build / "libedgeinfer_cuda_sim.so"), **env)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-m", "",
                        str(ROOT / "tests" / test_file), "-k", select],
                       env=env, capture_output=True, text=True, timeout=3000, cwd=ROOT)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|deselected)",
                                                r.stdout.splitlines()[-1] if r.stdout else "")}
    return r.returncode, counts, r.stdout[-6000:] + r.stderr[-3000:]


def _run_cuda_tests(sim_build: Path, select: str, test_file: str = "test_cuda.py", **env: str) -> dict[str, int]:
    rc, counts, tail = _pytest_cuda(sim_build, select, test_file, **env)
    assert rc == 0, tail
    assert "needs a CUDA GPU" not in tail and "has no test ops" not in tail, tail   # the simulator ran every GPU test
    return counts


E2E = "end_to_end or decode_steps or greedy or tiny"


@pytest.mark.slow
@pytest.mark.parametrize("order", ["forward", "reverse", "random"])
def test_cuda_op_tests_pass_on_the_simulator(sim_build, order):
    """Every per-op test of tests/test_cuda.py, in three thread orders (a race would differ)."""
    counts = _run_cuda_tests(sim_build, f"not test_library_builds and not ({E2E})", EISIM_ORDER=order, EISIM_SEED="7")
    assert counts.get("passed", 0) >= 95 and counts.get("skipped", 0) <= 2, counts   # 2: the no-GPU fallback tests


TOPK_BARRIER = "__syncthreads();   /* every thread has read wv / wi before the next round writes them */"


@pytest.mark.slow
def test_the_simulator_catches_a_deleted_barrier(tmp_path):
    """native/cuda without the barrier between two rounds of the top-k kernel: the next round's
    write of a warp's best races with the other warps' read of it. On a GPU that is a wrong
    answer now and then; on the simulator the top-k tests must fail."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "native" / "cuda", src)
    kernels = src / "kernels.cu"
    text = kernels.read_text()
    assert text.count(TOPK_BARRIER) == 1
    kernels.write_text(text.replace(TOPK_BARRIER, ""))
    broken = _build(tmp_path / "out", src)
    rc, counts, tail = _pytest_cuda(broken, "topk_matches", EISIM_ORDER="random", EISIM_SEED="7")
    assert rc != 0 and counts.get("failed", 0) >= 3, tail


@pytest.mark.slow
def test_cuda_end_to_end_tests_pass_on_the_simulator(sim_build):
    """SmolLM2 through the CUDA runtime (graphs, slots, prefix reuse) against the CPU and float64 oracles."""
    counts = _run_cuda_tests(sim_build, E2E)
    assert counts.get("passed", 0) >= 4, counts


@pytest.mark.slow
def test_cuda_lora_tests_pass_on_the_simulator(sim_build):
    """tests/test_cuda_lora.py: LoRA adapters per slot on the CUDA runtime against the CPU backend's,
    mixed-adapter batches against their solo runs."""
    counts = _run_cuda_tests(sim_build, "", "test_cuda_lora.py", EDGEINFER_STRICT="1")
    assert counts.get("passed", 0) >= 9 and not counts.get("skipped"), counts


@pytest.mark.slow
@pytest.mark.parametrize("select", ["lfm2 and not gqa4", "lfm2_gqa4", "qwen35 and not qwen35_b", "qwen35_b"])
def test_cuda_hybrid_tests_pass_on_the_simulator(sim_build, select):
    """tests/test_cuda_hybrid.py, one hybrid layout a process: LFM2 and Qwen3.5 on the CUDA runtime
    against the CPU backend (logits, greedy tokens), prefix reuse, n = 2 and speculative rollback
    against fresh engines, restore / drop of the device states."""
    counts = _run_cuda_tests(sim_build, select, "test_cuda_hybrid.py", EDGEINFER_STRICT="1")
    assert counts.get("passed", 0) >= 7 and not counts.get("skipped"), counts


@pytest.mark.slow
@pytest.mark.parametrize("select", ["f32", "f16"])
def test_cuda_gemma4_tests_pass_on_the_simulator(sim_build, select):
    """tests/test_cuda_gemma4.py, one file type a process: Gemma 4 (per-layer inputs, KV-shared layers,
    two head sizes) on the CUDA runtime against the CPU backend (logits, greedy tokens, KV bytes, a
    sliding context ring); attention over heads of 512 and 384 is test_cuda's ring attention op test."""
    counts = _run_cuda_tests(sim_build, select, "test_cuda_gemma4.py", EDGEINFER_STRICT="1")
    assert counts.get("passed", 0) >= 5 and not counts.get("skipped"), counts
