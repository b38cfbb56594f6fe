"""The engines `edgeinfer bench` times, behind one interface (`Runner`): edgeinfer through its
Engine, and the peers it is compared with (llama.cpp through llama-cpp-python, ONNX Runtime
GenAI). bench.py runs them in process, engine_process.py each in a worker process of its own."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .plan import KV_TYPES


class PeerSkipped(Exception):
    """A peer that cannot run here: reported, not fatal."""


class Runner:
    """One engine at one thread count. Times are wall-clock seconds (perf_counter)."""

    engine = "?"
    label = "?"
    n_vocab = 0
    kv_bytes: Optional[int] = None
    scratch_bytes: Optional[int] = None

    def pp(self, ids: list[int]) -> float:
        """Fresh sequence, process `ids`, logits of the last token only; seconds."""
        raise NotImplementedError

    def tg(self, prefix: list[int], n: int) -> float:
        """Fresh sequence, `prefix` untimed, then `n` greedy one-token steps; seconds."""
        raise NotImplementedError

    def ttft_tpot(self, ids: list[int], n: int) -> tuple[float, float]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class EdgeinferRunner(Runner):
    engine = "edgeinfer"

    def __init__(self, path: str, threads: int, n_ctx: int, batch: int, isa: str = "best", kv: str = "f16",
                 device: str = "cpu"):
        from ..engine import Engine

        self.eng = Engine.load(path, n_ctx=n_ctx, n_threads=threads, n_slots=1, max_batch=batch, isa=isa, kv_type=kv,
                        device=device)
        caps = self.eng.caps
        self.n_vocab = caps.n_vocab
        self.batch = caps.max_batch
        self.kv_bytes = caps.kv_bytes
        self.scratch_bytes = caps.scratch_bytes
        self.label = f"edgeinfer ({caps.isa})"   # e.g. "avx2", "cuda sm_90"
        self._logits = np.empty((1, self.n_vocab), dtype=np.float32)
        self._no_rows = np.empty(0, dtype=np.int32)
        self._last_row = np.zeros(1, dtype=np.int32)

    def _feed(self, lease, ids: list[int], want_logits: bool) -> Optional[np.ndarray]:
        """Feeds ids to the leased slot in chunks of max_batch: the engine's own step path."""
        out = None
        for i in range(0, len(ids), self.batch):
            chunk = ids[i:i + self.batch]
            last = i + len(chunk) == len(ids)
            rows = np.array([len(chunk) - 1], dtype=np.int32) if (last and want_logits) else self._no_rows
            out = lease.feed(chunk, rows, self._logits if (last and want_logits) else None)
        return out

    def pp(self, ids: list[int]) -> float:
        with self.eng.lease() as lease:
            t0 = time.perf_counter()
            self._feed(lease, ids, want_logits=True)
            return time.perf_counter() - t0

    def tg(self, prefix: list[int], n: int, on_start: Optional[Callable[[], None]] = None) -> float:
        """`on_start` runs once the prefix is in, right before the timed steps."""
        with self.eng.lease() as lease:
            tok = int(np.argmax(self._feed(lease, prefix, want_logits=True)[0]))
            if on_start:
                on_start()
            t0 = time.perf_counter()
            for _ in range(n):
                tok = int(np.argmax(lease.feed([tok], self._last_row, self._logits)[0]))
            return time.perf_counter() - t0

    def ttft_tpot(self, ids: list[int], n: int) -> tuple[float, float]:
        st = self.eng.generate(ids, max_tokens=n, temperature=0, ignore_eos=True).stats
        return float(st.ttft_s), float(st.tpot_s)

    def close(self) -> None:
        try:
            self.eng.close()
        finally:
            self.eng = None


def ggml_vector_isa(system_info: str) -> str:
    """The widest vector instruction set a ggml build was compiled for, from llama.cpp's system
    info line ("CPU : SSE3 = 1 | ... | AVX2 = 1 | ... | AVX512 = 1 | ..."): 'avx512', 'avx2',
    'neon', or '' when it names none of them. A build's sets are fixed at compile time (a
    generic wheel runs AVX2 on an AVX-512 host), so a ratio says which peer it was against."""
    for name in ("AVX512", "AVX2", "NEON"):
        if f"{name} = 1" in system_info:
            return name.lower()
    return ""


class LlamaCppRunner(Runner):
    """llama-cpp-python on the same file: greedy decode through its Python API."""

    engine = "llama.cpp"

    def __init__(self, path: str, threads: int, n_ctx: int, batch: int, kv: str = "f16",
                 flash_attn: bool = True):
        try:
            import llama_cpp
        except ImportError as e:
            raise PeerSkipped(f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python") from None
        self._lc = llama_cpp
        # Flash attention on, as llama.cpp's own tools run on a CPU ("-fa auto"); llama-cpp-python's
        # default is off. A quantized V cache needs it (-fa -ctk q8_0 -ctv q8_0).
        if kv != "f16" and not flash_attn:
            raise PeerSkipped("llama.cpp's quantized KV cache needs flash attention (drop :no-fa)")
        kv_args = ({} if kv == "f16" else {"type_k": llama_cpp.GGML_TYPE_Q8_0, "type_v": llama_cpp.GGML_TYPE_Q8_0})
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, n_batch=batch, n_ubatch=batch, flash_attn=flash_attn,
                                   logits_all=False, verbose=False, **kv_args)
        self.n_vocab = int(self.llm.n_vocab())
        fa = "" if flash_attn else " no-fa"
        isa = ggml_vector_isa(llama_cpp.llama_print_system_info().decode(errors="replace"))
        self.label = f"llama.cpp {getattr(llama_cpp, '__version__', '')}{f' ({isa})' if isa else ''}{fa}"
        self.kv_bytes = self._kv_bytes(KV_TYPES[kv])

    def _kv_bytes(self, bytes_per_value: float) -> Optional[int]:
        try:
            lc, m = self._lc, self.llm.model
            n_layer = int(lc.llama_model_n_layer(m))
            n_head = int(lc.llama_model_n_head(m))
            n_head_kv = int(lc.llama_model_n_head_kv(m))
            n_embd = int(lc.llama_model_n_embd(m))
            cells = int(self.llm.n_ctx())
            return int(cells * n_layer * 2 * (n_embd // n_head) * n_head_kv * bytes_per_value)  # K and V
        except Exception:
            return None

    def _last_logits(self) -> np.ndarray:
        ptr = self._lc.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def pp(self, ids: list[int]) -> float:
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - t0

    def tg(self, prefix: list[int], n: int) -> float:
        llm = self.llm
        llm.reset()
        llm.eval(prefix)
        tok = int(np.argmax(self._last_logits()))
        t0 = time.perf_counter()
        for _ in range(n):
            llm.eval([tok])
            tok = int(np.argmax(self._last_logits()))
        return time.perf_counter() - t0

    def ttft_tpot(self, ids: list[int], n: int) -> tuple[float, float]:
        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = int(np.argmax(self._last_logits()))
        t1 = time.perf_counter()
        for _ in range(n - 1):
            llm.eval([tok])
            tok = int(np.argmax(self._last_logits()))
        t2 = time.perf_counter()
        return t1 - t0, ((t2 - t1) / (n - 1) if n > 1 else 0.0)

    def close(self) -> None:
        try:
            self.llm.close()
        except Exception:
            pass
        self.llm = None


class OrtGenaiRunner(Runner):
    """ONNX Runtime GenAI on a model directory (genai_config.json + model.onnx), e.g. the int4
    CPU model that ``scripts/make_ort_model.py`` makes with ORT GenAI's own builder.

    Threads: ``model.decoder.session_options.intra_op_num_threads`` (overlaid on the
    directory's genai_config.json; ``inter_op_num_threads`` 1) is the only thread control
    ORT GenAI has on CPU: it sizes onnxruntime's intra-op pool (the calling thread plus
    threads - 1 workers). Greedy search (``do_sample=False``); ``min_length`` = ``max_length``
    so that an EOS never ends a timed loop early (edgeinfer and llama.cpp ignore EOS too).

    Step accounting: ``append_tokens`` runs the prompt through the model (all positions:
    the builder's default graph computes logits for every prompt token). A later
    ``generate_next_token`` first runs the forward for the token picked by the previous
    call (if any), then picks the next token from the logits. So the first call after
    ``append_tokens`` only picks (no forward): ``tg`` makes it untimed, then times ``n``
    calls = ``n`` one-token forwards, each followed by the greedy pick, like the others.
    """

    engine = "ort-genai"

    def __init__(self, model_dir: str, threads: int, n_ctx: int):
        d = Path(model_dir).expanduser()
        if not (d / "genai_config.json").is_file():
            raise PeerSkipped(f"{d} is not an ONNX Runtime GenAI model directory (no genai_config.json); "
                        f"make one with: python scripts/make_ort_model.py --out {d} (ORT GenAI's "
                        f"builder: python -m onnxruntime_genai.models.builder -i <hf dir> -o {d} "
                        f"-p int4 -e cpu)")
        try:
            import onnxruntime_genai as og
        except ImportError as e:
            raise PeerSkipped(f"onnxruntime-genai is not installed ({e}); pip install onnxruntime-genai") from None
        self.og = og
        self.threads = threads
        try:
            cfg = og.Config(str(d))
            cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
                "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
            self.model = og.Model(cfg)
        except Exception as e:
            raise PeerSkipped(f"onnxruntime-genai could not load {d}: {e}") from None
        self.n_ctx = n_ctx
        try:
            gcfg = json.loads((d / "genai_config.json").read_text())["model"]
        except Exception:
            gcfg = {}
        self.n_vocab = int(gcfg.get("vocab_size", 0) or 0)
        self.kv_bytes = self._kv_bytes(d, gcfg, n_ctx)
        self.label = f"ort-genai {getattr(og, '__version__', '')}".strip()

    @staticmethod
    def _kv_bytes(d: Path, gcfg: dict, n_ctx: int) -> Optional[int]:
        """K and V for n_ctx cells, in the dtype of the model's past_key_values inputs (the
        generator allocates them for max_length = the cells a test needs, at most n_ctx)."""
        try:
            dec = gcfg["decoder"]
            n_layer, n_kv, hd = (int(dec["num_hidden_layers"]), int(dec["num_key_value_heads"]),
                                 int(dec["head_size"]))
        except (KeyError, TypeError, ValueError):
            return None
        elem = 4  # float32, the CPU builder's KV type
        try:
            import onnx

            m = onnx.load(str(d / dec.get("filename", "model.onnx")), load_external_data=False)
            for i in m.graph.input:
                if i.name.startswith("past_key_values"):
                    elem = {1: 4, 10: 2, 16: 2}.get(i.type.tensor_type.elem_type, 4)
                    break
        except Exception:
            pass
        return n_ctx * n_layer * 2 * n_kv * hd * elem

    def _generator(self, max_length: int):
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=max_length, min_length=max_length, do_sample=False,
                                  batch_size=1)
        return self.og.Generator(self.model, params)

    def _step(self, g) -> None:
        if g.is_done():
            raise RuntimeError("ort-genai generator stopped early (EOS or max_length)")
        g.generate_next_token()

    def pp(self, ids: list[int]) -> float:
        g = self._generator(len(ids) + 1)
        t0 = time.perf_counter()
        g.append_tokens(np.asarray(ids, dtype=np.int32))  # runs the prompt through the model
        dt = time.perf_counter() - t0
        del g
        return dt

    def tg(self, prefix: list[int], n: int) -> float:
        g = self._generator(len(prefix) + n + 2)
        g.append_tokens(np.asarray(prefix, dtype=np.int32))
        self._step(g)                 # picks the first token from the prompt's logits (untimed)
        t0 = time.perf_counter()
        for _ in range(n):
            self._step(g)             # one forward of the last token, then the greedy pick
        dt = time.perf_counter() - t0
        del g
        return dt

    def ttft_tpot(self, ids: list[int], n: int) -> tuple[float, float]:
        g = self._generator(len(ids) + n + 1)
        t0 = time.perf_counter()
        g.append_tokens(np.asarray(ids, dtype=np.int32))
        self._step(g)                 # the first output token
        t1 = time.perf_counter()
        for _ in range(n - 1):
            self._step(g)
        t2 = time.perf_counter()
        del g
        return t1 - t0, ((t2 - t1) / (n - 1) if n > 1 else 0.0)

    def close(self) -> None:
        self.model = None


def _parse_peer(spec: str) -> tuple[str, Optional[str]]:
    s = spec.strip()
    low = s.lower()
    name, _, opt = low.partition(":")
    if name in ("llama.cpp", "llama-cpp", "llamacpp", "llama_cpp"):
        if opt not in ("", "fa", "no-fa"):
            raise ValueError(f"--compare {spec!r}: llama.cpp takes :fa (the default) or :no-fa")
        return "llama.cpp", opt or None
    for prefix in ("ort-genai:", "ort_genai:", "onnxruntime-genai:", "ort:"):
        if low.startswith(prefix):
            return "ort-genai", s[len(prefix):]
    if low in ("ort-genai", "onnxruntime-genai", "ort"):
        raise ValueError("--compare ort-genai needs a model directory: --compare ort-genai:DIR")
    raise ValueError(f"--compare {spec!r}: unknown peer (use llama.cpp or ort-genai:DIR)")


def make_runner(kind: str, arg: Optional[str], model_path: str, threads: int, n_ctx: int,
                batch: int, isa: str = "best", kv: str = "f16", device: str = "cpu") -> Runner:
    if kind == "edgeinfer":
        return EdgeinferRunner(model_path, threads, n_ctx, batch, isa, kv, device)
    if kind == "llama.cpp":
        return LlamaCppRunner(model_path, threads, n_ctx, batch, kv, flash_attn=arg != "no-fa")
    if kind == "ort-genai":
        if kv != "f16":
            raise PeerSkipped("ONNX Runtime GenAI models keep their KV cache in the model's own type; --kv applies "
                        "to edgeinfer and llama.cpp")
        return OrtGenaiRunner(arg or "", threads, n_ctx)
    raise ValueError(kind)
