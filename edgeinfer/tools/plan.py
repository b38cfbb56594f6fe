"""Memory planner: what a model needs for a given context and number of slots.

The prediction is the process's peak resident memory (RSS) under load, counted as

    total = weights + mapped + KV arena + working buffers + overhead

* weights: the GGUF file's tensor bytes, less an MTP block's (Qwen3.5's NextN layer after the
  trunk: the trunk never reads it; see "MTP draft" below). The runtime packs every matrix into an arena of its
  own (``packed_weight_bytes`` in ``Engine.info()``: the tensor bytes, or up to a few percent more
  where a type's scales are unpacked at load: 1B-shape files Q4_K_M +1.6%, Q3_K_M +2.2%, IQ4_XS
  +1.0%; priced here at the tensor bytes) and drops
  the packed tensors' pages of the file mapping; what it does not pack (norms, an untied token
  embedding) it reads from the mapping, and a token embedding tied to the packed head is looked
  up in the packed copy. Each weight byte is resident once;
* mapped: file pages resident on top of that: the metadata the reader parses (tokenizer
  tables, tensor infos: the bytes before the tensor data);
* KV arena = 2 (K and V) x n_layers x n_kv_heads x head_dim x capacity x
  bytes_per_element x n_slots  (docs/architecture.md; f16: 2 bytes, q8_0: 34/32 bytes), zeroed
  at load, so resident from the start; a hybrid's recurrent layers (LFM2's short convolutions,
  Qwen3.5's Gated DeltaNet) hold no cells;
* recurrent state (hybrids only) = n_slots x (1 live + n_snapshots kept copies) x the layers'
  state floats x 4 bytes: each recurrent layer's conv window ((conv_kernel - 1) x channels)
  and, for a delta-net layer, its value heads' d_k x d_v matrices (native/src/state.c); it
  does not grow with the context (``Engine.info()["state_bytes"]``);
* working buffers are what ``ei_runtime_create`` (native/src/runtime.c) allocates
  besides the KV arena and the states: activations for ``max_batch`` tokens, the quantized
  activation blocks, per-thread attention scores, RoPE tables and cell bookkeeping, and a
  hybrid's recurrent layers' rows and work areas (native/src/state.c: the short conv's in_proj
  rows, conv taps; recurrent.c: the delta-net's qkv, gate and decay rows and its chunked
  delta rule's per-head work areas);
* overhead: the interpreter and the libraries the process imports (``PROCESS_BASELINE``,
  measured: ``engine`` for a script that calls ``edgeinfer.load``, ``serve`` for
  ``edgeinfer serve`` with its HTTP stack), the Python objects of the metadata and tokenizer
  (``TOKENIZER_BYTES_PER_TOKEN`` per vocabulary entry), for ``serve`` the structured-output
  token table (``GRAMMAR_BYTES_PER_TOKEN``), one logits row per slot, and up to 2 MiB per big
  arena (packed weights, K, V), which the runtime places on 2 MiB pages.

* MTP draft (``speculative="mtp"``, planned only when asked for): the block runs as its own
  one-layer model, ``block_config`` (model/mtp_block.py; the same function Engine.load builds it
  from), so its KV ring, weights and working buffers are that model's ``kv_bytes``,
  tensor bytes and ``scratch_bytes`` (``Engine.info()["draft_kv_bytes"]`` is the first); its
  head is the trunk's packed copy, counted once.

``plan`` agrees with the engine's own accounting (``engine.info()['kv_bytes']`` and
``Engine.info()["scratch_bytes"]``) to well within 5% (to the byte on the tested dense and
hybrid files: tests/test_states.py checks the hybrids' buffers exactly), and its total with the
peak RSS of a real load (every slot prefilled to its context with prompts that walk the
vocabulary, then decoded) measured in a fresh process to within 10% (tests/test_doctor_plan.py). What it
leaves out is small: file pages the kernel maps around the ones read (fault-around; clean
and reclaimable), and allocator slack.
Both KV types the runtime implements are planned: f16 (the default) and q8_0 (``kv_type="q8_0"``).
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from ..arch import HeadDims
from ..arch.table import RecurrentDims
from ..backends.base import KVPlan
from ..errors import EdgeInferError
from ..model.config import kv_layer_cells, layer_state_floats, local_ring_cells

__all__ = [
    "KV_TYPES", "DEFAULT_CTXS", "DEFAULT_SLOTS", "PROCESS_BASELINE", "ModelShape", "PlanRow", "model_shape",
    "kv_bytes", "kv_layer_cells", "state_bytes", "layer_state_floats", "scratch_bytes", "recurrent_scratch_bytes", "mapped_bytes", "overhead_bytes", "plan_one", "plan_grid",
    "largest_fit", "parse_size", "human", "ServePlan", "plan_serve", "MemoryBudgetError", "SPECULATIVE",
    "mtp_kv_bytes",
]

# bytes per KV element; "implemented" is whether ei_runtime_create accepts it today
KV_TYPES = {"f16": 2.0, "q8_0": 34 / 32}   # bytes per K or V element
DEFAULT_CTXS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
DEFAULT_SLOTS = (1, 2, 4, 8)
DEFAULT_MAX_BATCH = 256          # Engine.load's default
ATTN_CHUNK = 256                 # EI_ATTN_CHUNK (native/src/attention.h)
# an activation block (ei_act_row_bytes, native/src/kernels.h): its ei_q8a (float d, float s,
# int8 q[32]) and the int32 sums of its two 16-quant halves
ACT_BLOCK_BYTES = 40 + 2 * 4
DELTA_CHUNK = 64                 # EI_DELTA_CHUNK (edgeinfer_layout.h): a run of this many tokens goes by chunks
# RSS of a process that has imported what it needs, before any model (x86_64, CPython 3.11):
# `import edgeinfer.engine` (numpy, jinja2, the native library) and, for `edgeinfer serve`,
# `edgeinfer.cli.main`, `edgeinfer.server` and llguidance on top (aiohttp, prometheus-client, typer)
PROCESS_BASELINE = {"engine": 45 * 2**20, "serve": 75 * 2**20}
PROCESS_OVERHEAD = PROCESS_BASELINE["serve"]   # what `serve` counts once, however many models
# Python objects of the GGUF metadata and the tokenizer, per vocabulary entry (token strings,
# merges, id maps): SmolLM2's BPE (49152 tokens) measured 19.7 MiB
TOKENIZER_BYTES_PER_TOKEN = 420
# llguidance's token table, per vocabulary entry: built by a server's first constrained request
# (response_format, a schema or grammar, a forced tool call) and kept; SmolLM2: 21.9 MiB
GRAMMAR_BYTES_PER_TOKEN = 470
# speculative modes whose memory the plan prices ("lookup" needs none; a draft model is planned
# on its own file)
SPECULATIVE = ("mtp",)


@dataclass
class ModelShape(HeadDims, RecurrentDims):
    """What the planner needs from a model (read from GGUF metadata, no weights loaded)."""
    name: str
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rope_dim: int
    weights_bytes: int
    file_bytes: int = 0
    path: str = ""
    swa_window: int = 0      # sliding-window layers (Gemma 3): their window and the local:global pattern
    swa_pattern: int = 0
    header_bytes: int = 0    # metadata and tensor infos: the file's bytes before the tensor data
    # per layer (Gemma 4): K elements per cell it stores (0: a KV-shared or recurrent layer), sliding flags
    layer_kv_elems: tuple[int, ...] = ()
    swa_layers: tuple[bool, ...] = ()
    # per layer (hybrids): floats of its recurrent state per slot (0: an attention layer)
    layer_state: tuple[int, ...] = ()
    attn_gate: bool = False   # gated attention (Qwen3.5): q rows hold query and gate, plus a gate buffer
    # hybrids' working buffers: per layer the channels of its conv window (0: none), the conv's
    # taps, and Qwen3.5's Gated DeltaNet sizes (0: none)
    layer_conv: tuple[int, ...] = ()
    conv_kernel: int = 0
    ssm_head_dim: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    nextn: bool = False       # an MTP block's model: its eh_proj reads 2 x n_embd wide rows
    # Qwen3.5: the first MTP block as the one-layer model speculative="mtp" runs (weights_bytes:
    # its own tensors), and the tensor bytes of all the file's blocks, which the trunk never reads
    mtp: Optional["ModelShape"] = None
    mtp_file_bytes: int = 0


def model_shape(path: str | os.PathLike) -> ModelShape:
    """Reads the shape and tensor bytes of a GGUF model (a path or a known model name)."""
    from ..gguf.reader import GGUFFile
    from ..model.config import ModelConfig
    from ..model.mtp_block import block_config   # imports the native library: only here
    from ..hub import resolve_model

    p = Path(resolve_model(str(path)))
    g = GGUFFile(p)
    try:
        cfg = ModelConfig.from_gguf(g)
        layer = {w.name: w.layer for w in cfg.weights()}
        weights = sum(int(t.nbytes) for t in g.tensors.values())
        # MTP blocks (layers after the trunk): the trunk skips them (native_model.model_tensors)
        blocks = {n: int(t.nbytes) for n, t in g.tensors.items() if layer.get(n, -1) >= cfg.n_layer}
        name = str(g.metadata.get("general.name", "") or p.stem)
        header = int(g.data_offset)
    finally:
        g.close()
    mtp = None
    if cfg.n_mtp:
        first = sum(b for n, b in blocks.items() if layer[n] == cfg.n_layer)   # the block speculative="mtp" runs
        mtp = _shape(block_config(cfg), name=f"{name} (MTP block)", weights_bytes=first, nextn=True)
    return _shape(cfg, name=name, weights_bytes=weights - sum(blocks.values()), file_bytes=p.stat().st_size,
                  path=str(p), header_bytes=header, mtp=mtp,
                  mtp_file_bytes=sum(blocks.values()))


def _shape(cfg, **extra) -> ModelShape:
    """The planner's view of a ModelConfig (the trunk, or the MTP block's one-layer model)."""
    return ModelShape(arch=cfg.arch, n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head,
                      n_head_kv=cfg.n_head_kv, head_dim=cfg.head_dim, n_ff=cfg.n_ff, n_vocab=cfg.n_vocab,
                      n_ctx_train=cfg.n_ctx_train, rope_dim=cfg.rope_dim, swa_window=cfg.swa_window,
                      swa_pattern=cfg.swa_pattern,
                      layer_kv_elems=tuple(e if c else 0 for e, c in zip(cfg.kv_layer_elems(), cfg.kv_layer_cells(1, 1))),
                      swa_layers=cfg.swa_layers, layer_state=layer_state_floats(cfg),
                      attn_gate=cfg.has_attn_gate, layer_conv=_conv_channels(cfg), conv_kernel=cfg.conv_kernel,
                      ssm_head_dim=cfg.ssm_head_dim, ssm_k_heads=cfg.ssm_k_heads, ssm_v_heads=cfg.ssm_v_heads,
                      **extra)


def _conv_channels(cfg) -> tuple[int, ...]:
    """Channels of each trunk layer's causal conv (ei_layer_conv_channels, edgeinfer_layout.h):
    n_embd for a short conv, q, k and v for a delta-net layer, 0 for attention."""
    width = {"shortconv": cfg.n_embd, "recurrent": cfg.ssm_conv_dim}
    return tuple(width.get(k, 0) for k in cfg.layer_kinds[:cfg.n_layer])


def kv_bytes(m: ModelShape, ctx: int, slots: int, kv: str = "f16", max_batch: int = DEFAULT_MAX_BATCH) -> int:
    """The KV arena: 2 x n_kv_heads x head_dim x bytes/element x n_slots x the cells of all
    layers, where a layer holds `capacity` cells, but a sliding-window layer (Gemma 3) only
    its own ring of window + max_batch - 1 cells when that is smaller."""
    if kv not in KV_TYPES:
        raise ValueError(f"kv must be one of {sorted(KV_TYPES)}, got {kv!r}")
    per_elem = KV_TYPES[kv]
    cells = kv_layer_cells(m.n_layer, m.swa_window, m.swa_pattern, ctx, max_batch, m.swa_layers)
    elems = m.layer_kv_elems or (m.n_head_kv * m.head_dim,) * m.n_layer
    return int(round(2 * sum(e * c for e, c in zip(elems, cells)) * per_elem * slots))


def mtp_kv_bytes(m: ModelShape, ctx: int, slots: int, kv: str = "f16", max_batch: int = DEFAULT_MAX_BATCH) -> int:
    """The MTP block's own KV ring (speculative="mtp"): its one-layer model's kv_bytes, slots x
    ctx cells like the trunk's ring (Engine.info()["draft_kv_bytes"])."""
    return kv_bytes(_require_mtp(m), ctx, slots, kv, max_batch)


def _require_mtp(m: ModelShape) -> ModelShape:
    if m.mtp is None:
        raise ValueError(f"speculative 'mtp' drafts with the model file's own MTP block (Qwen3.5's NextN layer, "
                         f"{m.arch}.nextn_predict_layers >= 1), and {m.name} ({m.path or m.arch}) has no MTP block"
                         + (" (converted without it?)" if m.arch == "qwen35" else ""))
    return m.mtp


def act_row_bytes(n_cols: int) -> int:
    """ei_act_row_bytes: a row's blocks, padded to an odd number of 64-byte lines."""
    lines = (n_cols // 32 * ACT_BLOCK_BYTES + 63) // 64
    return (lines | 1) * 64


def scratch_bytes(m: ModelShape, ctx: int, slots: int, max_batch: int = DEFAULT_MAX_BATCH,
                  n_threads: Optional[int] = None, n_snapshots: Optional[int] = None) -> int:
    """Working buffers as ei_runtime_create allocates them (everything but the KV arena and the
    recurrent states), a hybrid's recurrent layers' included (recurrent_scratch_bytes)."""
    B, d, qd, kvd, ff = max_batch, m.n_embd, m.q_dim, m.kv_dim, m.n_ff
    threads = n_threads or _physical_cores()
    widest = max(d, ff, qd, m.ssm_inner, 2 * d if m.nextn else 0)
    half = max(m.rope_dim // 2, 1)
    f32 = 4
    total = m.n_layer * 8                                     # layer offsets
    total += slots * ctx * 4 + slots * 4                      # cell_pos, n_used
    total += B * d * f32 * 3                                  # x, xn, out_rows
    total += B * qd * f32 * (4 if m.attn_gate else 2)         # q, att (gated: q holds the gate, + its buffer)
    total += B * kvd * f32 * 2                                # kc, vc (this step's K/V before the arena)
    total += B * ff * f32 * 2                                 # gate, up
    total += B * act_row_bytes(widest + 31)                   # quantized activations
    group = max(m.n_head // max(m.n_head_kv, 1), 1)
    total += threads * 2 * group * ATTN_CHUNK * f32           # attention scores per thread (two tokens)
    # attention partials (chunked softmax): as many tokens as fit in ~4 MiB, at least one, and
    # their per-KV-head done counters
    part_per_tok = m.n_head * ((ctx + ATTN_CHUNK - 1) // ATTN_CHUNK) * (m.head_dim + 2)
    attn_tokens = max(1, min((1 << 20) // part_per_tok, B))
    total += attn_tokens * part_per_tok * f32 + attn_tokens * m.n_head_kv * 4
    total += B * half * f32 * 2 + half * 8                    # rope cos, sin, frequencies
    total += B * 2 * d * f32 if m.nextn else 0                # an MTP block's eh_proj input rows
    if m.swa_window:                                          # sliding-window layers
        total += threads * ctx * 4                            # masked cell positions
        r = local_ring_cells(m.swa_window, ctx, max_batch)
        total += slots * r * 4 + slots * 4 if r else 0        # the local ring's cell positions
        total += B * half * f32 * 2 + half * 8                # the local layers' RoPE tables
    return total + recurrent_scratch_bytes(m, slots, max_batch, n_snapshots)


def recurrent_scratch_bytes(m: ModelShape, slots: int, max_batch: int = DEFAULT_MAX_BATCH,
                            n_snapshots: Optional[int] = None) -> int:
    """A hybrid's working buffers besides its states (native/src/state.c, ei_state_create; 0
    for attention-only models): the kept copies' bookkeeping, the short conv's in_proj rows
    (B, C, x) and gated rows, the conv taps turned tap-major, and for Gated DeltaNet layers
    (recurrent.c, ei_deltanet_scratch_floats) the qkv rows and their conv, the output gate z and
    output o, the decays and betas, each twice, plus one chunked delta-rule work area per value
    head (deltanet.h, ei_delta_scratch_floats at DELTA_CHUNK)."""
    if not sum(m.layer_state):
        return 0
    if n_snapshots is None:
        n_snapshots = KVPlan.snapshots_for(sum(m.layer_state) * 4)
    B, d, f32 = max_batch, m.n_embd, 4
    total = 2 * m.n_layer * 8                                 # state offsets, conv tap pointers
    total += slots * 4 + slots * n_snapshots * 4 + 1 + B * 4  # positions seen, kept copies' tags, keep rows
    total += B * 5 * d * f32                                  # short conv: in_proj's B, C, x; B*x and y
    total += m.conv_kernel * sum(m.layer_conv) * f32          # conv taps
    if m.ssm_head_dim:
        dn = B * (2 * m.ssm_conv_dim + 2 * m.ssm_inner + 2 * m.ssm_v_heads)
        dn += m.ssm_v_heads * _delta_scratch_floats(DELTA_CHUNK, m.ssm_head_dim, m.ssm_head_dim)
        total += dn * f32
    return total


def _delta_scratch_floats(chunk: int, dk: int, dv: int) -> int:
    """One value head's delta-rule work area (ei_delta_scratch_floats, native/src/deltanet.h):
    u [chunk][dv], c and w [pad], K^T [dk][pad], one chunk x chunk product [chunk][pad]."""
    rows = max(chunk, 1)
    pad = (rows + 15) // 16 * 16
    return rows * dv + pad * (2 + dk + rows)


def state_bytes(m: ModelShape, slots: int, n_snapshots: int | None = None) -> int:
    """The recurrent layers' states (0 for attention-only models): per slot its live state and
    n_snapshots kept copies (prefix reuse, n > 1 siblings, speculative rollback; by default as
    many as Engine.load keeps, KVPlan.snapshots_for), each the layers' state floats in F32.
    Independent of the context."""
    copy = sum(m.layer_state) * 4
    if n_snapshots is None:
        n_snapshots = KVPlan.snapshots_for(copy)
    return slots * (1 + n_snapshots) * copy


HUGE_PAGE = 2 << 20   # the packed weights, K and V arenas sit on 2 MiB pages (runtime.c: alloc_huge)


def mapped_bytes(m: ModelShape) -> int:
    """File pages resident besides the weights: the metadata. A tied embedding is resident once
    either way: packed, its lookups read the packed head; unpacked (a type the target has no
    packed kernel for, e.g. Q8_0 on NEON), the head and the lookups both read the mapping."""
    return m.header_bytes


def overhead_bytes(m: ModelShape, slots: int, process: str = "serve") -> int:
    """Process overhead: interpreter and libraries (`process`: "engine" or "serve"), the
    tokenizer and metadata objects, with "serve" the structured-output token table (any request
    may ask for it), logits rows, and the last, partly used 2 MiB page of each of the three
    big arenas."""
    if process not in PROCESS_BASELINE:
        raise ValueError(f"process must be one of {sorted(PROCESS_BASELINE)}, got {process!r}")
    per_token = TOKENIZER_BYTES_PER_TOKEN + (GRAMMAR_BYTES_PER_TOKEN if process == "serve" else 0)
    return PROCESS_BASELINE[process] + m.n_vocab * per_token + slots * m.n_vocab * 4 + 3 * HUGE_PAGE


@dataclass
class PlanRow:
    ctx: int
    slots: int
    kv: str
    weights: int
    kv_bytes: int
    scratch: int
    overhead: int
    total: int
    fits: Optional[bool] = None
    mapped: int = 0
    state_bytes: int = 0     # hybrids' recurrent states, priced apart from the KV arena
    # speculative="mtp": the MTP block's own KV ring, weights and working buffers (0: not planned)
    speculative: Optional[str] = None
    mtp_kv_bytes: int = 0
    mtp_weights: int = 0
    mtp_scratch: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def plan_one(m: ModelShape, ctx: int, slots: int, kv: str = "f16", memory: Optional[int] = None,
             max_batch: int = DEFAULT_MAX_BATCH, n_threads: Optional[int] = None,
             process: str = "serve", speculative: Optional[str] = None) -> PlanRow:
    """The peak RSS of one model with `slots` slots of `ctx` cells, in a `process` ("serve":
    `edgeinfer serve`; "engine": a script that calls edgeinfer.load); with speculative="mtp",
    plus the MTP block's KV ring, weights and buffers (ValueError when the file has no block)."""
    if speculative is not None and speculative not in SPECULATIVE:
        raise ValueError(f"the plan prices speculative {' / '.join(map(repr, SPECULATIVE))} (lookup needs no "
                         f"memory; plan a draft model with its own file), got {speculative!r}")
    kvb = kv_bytes(m, ctx, slots, kv, max_batch)
    stb = state_bytes(m, slots)
    scr = scratch_bytes(m, ctx, slots, max_batch, n_threads)
    ovh = overhead_bytes(m, slots, process)
    mapped = mapped_bytes(m)
    mkv = mw = mscr = 0
    if speculative == "mtp":
        block = _require_mtp(m)
        mkv, mw = mtp_kv_bytes(m, ctx, slots, kv, max_batch), block.weights_bytes
        mscr = scratch_bytes(block, ctx, slots, max_batch, n_threads)
        ovh += 3 * HUGE_PAGE + m.n_vocab * 4   # its packed, K and V arenas' last pages; its logits row
    total = m.weights_bytes + mapped + kvb + stb + scr + ovh + mkv + mw + mscr
    row = PlanRow(ctx=ctx, slots=slots, kv=kv, weights=m.weights_bytes, kv_bytes=kvb, scratch=scr,
                  overhead=ovh, total=total, fits=None if memory is None else total <= memory, mapped=mapped,
                  state_bytes=stb, speculative=speculative, mtp_kv_bytes=mkv, mtp_weights=mw, mtp_scratch=mscr)
    if m.n_ctx_train and ctx > m.n_ctx_train:
        row.notes.append(f"ctx above the trained context ({m.n_ctx_train})")
    return row


def plan_grid(m: ModelShape, ctxs: Iterable[int] = DEFAULT_CTXS, slots: Iterable[int] = DEFAULT_SLOTS,
              kv: str = "f16", memory: Optional[int] = None, max_batch: int = DEFAULT_MAX_BATCH,
              n_threads: Optional[int] = None, speculative: Optional[str] = None) -> list[PlanRow]:
    return [plan_one(m, c, s, kv, memory, max_batch, n_threads, speculative=speculative) for c in ctxs for s in slots]


def default_ctxs(m: ModelShape) -> list[int]:
    """The grid's contexts: powers of two from 512 up to the trained context (included)."""
    top = m.n_ctx_train or 4096
    out = [c for c in DEFAULT_CTXS if c <= top]
    if top not in out and top <= DEFAULT_CTXS[-1]:
        out.append(top)
    return out or [min(top, 512)]


def largest_fit(m: ModelShape, memory: int, slots: Iterable[int] = DEFAULT_SLOTS, kv: str = "f16",
                max_batch: int = DEFAULT_MAX_BATCH, n_threads: Optional[int] = None,
                ctx_cap: Optional[int] = None, speculative: Optional[str] = None) -> dict[int, Optional[int]]:
    """For each slot count, the largest context (a multiple of 256, at most the trained
    context or ctx_cap) whose plan fits in `memory`; None when not even 256 fits."""
    cap = ctx_cap or m.n_ctx_train or 131072
    out: dict[int, Optional[int]] = {}
    for s in slots:
        lo, hi = 0, cap // 256
        while lo < hi:   # largest k with plan(256 k) <= memory; the total grows with k
            mid = (lo + hi + 1) // 2
            if plan_one(m, 256 * mid, s, kv, memory, max_batch, n_threads, speculative=speculative).fits:
                lo = mid
            else:
                hi = mid - 1
        out[s] = 256 * lo if lo else None
    return out


class MemoryBudgetError(EdgeInferError):
    """The models asked for do not fit the memory budget (`serve` refuses before loading)."""


@dataclass
class ServePlan:
    """The plan of several models served by one process: one row per model (each with its
    own KV arena and working buffers), the process overhead counted once."""
    rows: list[tuple[str, PlanRow]]
    total: int
    memory: Optional[int]
    adapter_bytes: int = 0      # the LoRA adapters' budget (serve --lora-budget), when adapters are served

    @property
    def fits(self) -> Optional[bool]:
        return None if self.memory is None else self.total <= self.memory

    def describe(self) -> str:
        parts = [f"{name}: weights {human(r.weights)} + mapped {human(r.mapped)} + KV {human(r.kv_bytes)}"
                 + (f" + state {human(r.state_bytes)}" if r.state_bytes else "")
                 + (f" + MTP draft {human(r.mtp_kv_bytes + r.mtp_weights + r.mtp_scratch)}" if r.speculative else "")
                 + f" + buffers {human(r.scratch)} + overhead {human(r.overhead - PROCESS_OVERHEAD)}"
                 for name, r in self.rows]
        adapters = f"; LoRA adapters {human(self.adapter_bytes)}" if self.adapter_bytes else ""
        return "; ".join(parts) + adapters + f"; process {human(PROCESS_OVERHEAD)}"


def plan_serve(models: list[tuple[str, ModelShape]], ctx: int, slots: int, kv: str = "f16",
               memory: Optional[int] = None, max_batch: int = DEFAULT_MAX_BATCH,
               n_threads: Optional[int] = None, adapter_bytes: int = 0,
               speculative: Optional[dict[str, str]] = None) -> ServePlan:
    """What `serve` needs for every model at once, each with `slots` slots of `ctx` cells, plus
    the LoRA adapters' budget. Every model counts its weights in full, even two names for one
    file: each engine packs its own copy. `speculative`: model name -> mode ("mtp") of the models
    that draft with their MTP block."""
    spec = speculative or {}
    rows = [(name, plan_one(m, ctx, slots, kv, memory, max_batch, n_threads, speculative=spec.get(name)))
            for name, m in models]
    total = sum(r.total for _, r in rows) - PROCESS_OVERHEAD * (len(rows) - 1) + adapter_bytes   # one process
    return ServePlan(rows, total, memory, adapter_bytes)


def check_serve(models: list[tuple[str, ModelShape]], ctx: int, slots: int, kv: str, memory: int,
                max_batch: int = DEFAULT_MAX_BATCH, n_threads: Optional[int] = None,
                budget_source: str = "", adapter_bytes: int = 0,
                speculative: Optional[dict[str, str]] = None) -> ServePlan:
    """plan_serve, raising MemoryBudgetError naming every figure when the models do not fit."""
    p = plan_serve(models, ctx, slots, kv, memory, max_batch, n_threads, adapter_bytes, speculative)
    if not p.fits:
        src = f" ({budget_source})" if budget_source else ""
        raise MemoryBudgetError(
            f"the {len(models)} model(s) need {human(p.total)} with {slots} slot(s) x {ctx} cells ({kv} KV), "
            f"more than the memory budget of {human(memory)}{src}: {p.describe()}. "
            f"Serve fewer or smaller models, or lower --ctx / --slots, or use --kv q8_0")
    return p


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMgGtT]?)(i?)([bB]?)\s*$")


def parse_size(text: str) -> int:
    """'8GB' -> 8e9, '8GiB' or '8G' -> 8 x 2^30, '512MiB', '1.5T', or plain bytes."""
    mt = _SIZE.match(str(text))
    if not mt:
        raise ValueError(f"cannot read a memory size from {text!r} (try 8GB, 7.5GiB, 512M)")
    num, unit, binary, b = mt.groups()
    value = float(num)
    if unit:
        power = "KMGT".index(unit.upper()) + 1
        # "GB" is decimal; "GiB" and bare "G" are binary (as docker and ulimit read them)
        base = 1000 if (b and not binary) else 1024
        value *= base ** power
    return int(value)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def _physical_cores() -> int:
    try:
        from ..backends.cpu import cpu_report

        return cpu_report()["physical_cores"]
    except Exception:  # pragma: no cover - planning works without the native library
        return os.cpu_count() or 1
