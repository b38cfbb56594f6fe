"""Each native status code reaches Python as its own NativeError subclass (edgeinfer/errors.py),
through the one translation in edgeinfer/_native.py. The CUDA library's codes are checked in
tests/test_cuda.py (on a GPU, or on the simulator through tests/test_cuda_sim.py)."""
from __future__ import annotations

import numpy as np
import pytest

import edgeinfer
from edgeinfer._native import check, ffi, lib
from edgeinfer.backends import Batch
from edgeinfer.errors import (InvalidArgumentError, NativeError, NativeOutOfMemoryError, NativeUnsupportedError,
                              RangeError, StateError, UnsupportedTypeError)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.support.gguf_corpus import tiny_llama

    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    path.write_bytes(tiny_llama().build())
    with edgeinfer.load(str(path), n_ctx=16, n_threads=1, n_slots=2, max_batch=4) as eng:
        yield eng


def test_every_error_is_a_native_error():
    for cls in (InvalidArgumentError, NativeOutOfMemoryError, NativeUnsupportedError, RangeError, StateError):
        assert issubclass(cls, NativeError)
    assert issubclass(NativeUnsupportedError, UnsupportedTypeError)   # `except UnsupportedTypeError` sees it too


def test_forward_out_of_range_is_a_range_error(tiny):
    rt = tiny.runner.runtime
    n_vocab = tiny.config.n_vocab
    for batch, what in [(Batch.of_slot(2, [3], [0], [0], [0]), "slot 2"),
                        (Batch.of_slot(0, [n_vocab], [0], [0], [0]), f"token id {n_vocab}"),
                        (Batch.of_slot(0, [3], [0], [16], [0]), "cell 16"),
                        (Batch.of_slot(0, [3], [-1], [0], [0]), "position -1"),
                        (Batch.of_slot(0, [3] * 5, range(5), range(5), [4]), "batch of 5")]:
        with pytest.raises(RangeError, match=what):
            rt.forward(batch)
    with pytest.raises(RangeError, match="slot 9"):
        rt.forget_from(9, 0)


def test_a_slide_window_wider_than_the_ring_is_an_invalid_argument(tiny):
    p = ffi.new("ei_runtime_params *")
    p.n_threads, p.n_slots, p.n_ctx, p.n_sink, p.max_batch = 1, 1, 16, 4, 4
    p.kv_type, p.isa = lib.EI_TYPE_F16, lib.EI_ISA_BEST
    p.slide_window = 13     # the 12 non-sink cells cannot show 13 positions
    out = ffi.new("ei_runtime **")
    with pytest.raises(InvalidArgumentError, match=r"slide_window=13 must be in \[0, n_ctx - n_sink = 12\]"):
        check(lib.ei_runtime_create(tiny.runner.runtime.model.handle, p, out), "runtime_create")


def test_forward_bad_output_rows_is_an_invalid_argument(tiny):
    with pytest.raises(InvalidArgumentError, match="output rows"):
        tiny.runner.runtime.forward(Batch.of_slot(0, [3], [0], [0], [0, 0]))


def test_q8_0_kv_on_head_dim_16_is_unsupported(tiny):
    # The CPU backend allows q8_0; the kernels do not for this model's head_dim.
    with pytest.raises(NativeUnsupportedError, match="head sizes that are multiples of 32"):
        edgeinfer.load(str(tiny.path), n_ctx=16, n_threads=1, kv_type="q8_0")


def test_set_tensor_after_finalize_is_a_state_error(tiny):
    model = tiny.runner.runtime.model
    norm = np.ones(tiny.config.n_embd, dtype=np.float32)
    with pytest.raises(StateError, match="already finalized"):
        check(lib.ei_model_set_tensor(model.handle, 0, lib.EI_T_ATTN_NORM, ffi.from_buffer(norm),
                                      lib.EI_TYPE_F32, len(norm), 1), "set_tensor")


def test_an_allocation_that_cannot_succeed_is_out_of_memory():
    row = np.zeros(64, dtype=np.uint8)
    x = np.zeros(64, dtype=np.float32)
    out = ffi.new("float *")
    n = 1 << 62   # a multiple of every block size; its activation blocks fit no address space
    with pytest.raises(NativeOutOfMemoryError):
        check(lib.ei_kernel_dot(lib.EI_TYPE_Q8_0, lib.EI_ISA_SCALAR, n, ffi.from_buffer(row),
                                ffi.from_buffer("float[]", x), out), "dot")


def test_an_unknown_status_is_still_a_native_error():
    with pytest.raises(NativeError) as err:
        check(99, "future call")
    assert type(err.value) is NativeError and "status 99" in str(err.value)
