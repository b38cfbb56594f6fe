"""Weights as native handles: the GGUF mmap's tensors handed to C without copying."""
from __future__ import annotations

from ..gguf.reader import GGUFFile
from .._native import check, ffi, lib
from .config import ModelConfig

ARCH_IDS = {"llama": lib.EI_ARCH_LLAMA, "qwen2": lib.EI_ARCH_QWEN2}

GLOBAL_ROLES = {
    "token_embd.weight": lib.EI_T_TOKEN_EMBD,
    "output_norm.weight": lib.EI_T_OUTPUT_NORM,
    "output.weight": lib.EI_T_OUTPUT,
    "rope_freqs.weight": lib.EI_T_ROPE_FREQS,
}
LAYER_ROLES = {
    "attn_norm.weight": lib.EI_T_ATTN_NORM,
    "attn_q.weight": lib.EI_T_ATTN_Q,
    "attn_k.weight": lib.EI_T_ATTN_K,
    "attn_v.weight": lib.EI_T_ATTN_V,
    "attn_q.bias": lib.EI_T_ATTN_Q_BIAS,
    "attn_k.bias": lib.EI_T_ATTN_K_BIAS,
    "attn_v.bias": lib.EI_T_ATTN_V_BIAS,
    "attn_output.weight": lib.EI_T_ATTN_OUT,
    "ffn_norm.weight": lib.EI_T_FFN_NORM,
    "ffn_gate.weight": lib.EI_T_FFN_GATE,
    "ffn_up.weight": lib.EI_T_FFN_UP,
    "ffn_down.weight": lib.EI_T_FFN_DOWN,
}


class NativeModel:
    """Owns an ei_model whose tensors point into the (kept-open) GGUF mmap."""

    def __init__(self, gguf: GGUFFile, cfg: ModelConfig):
        self.gguf = gguf          # keeps the mmap alive as long as the native model
        self.cfg = cfg
        c = ffi.new("ei_model_config *")
        c.arch = ARCH_IDS[cfg.arch]
        c.n_layer, c.n_embd, c.n_head, c.n_head_kv = cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv
        c.head_dim, c.n_ff, c.n_vocab = cfg.head_dim, cfg.n_ff, cfg.n_vocab
        c.rope_dim, c.rope_neox = cfg.rope_dim, int(cfg.rope_neox)
        c.rope_theta, c.rope_freq_scale, c.rms_eps = cfg.rope_theta, cfg.rope_freq_scale, cfg.rms_eps
        out = ffi.new("ei_model **")
        check(lib.ei_model_create(c, out), "model_create")
        self.handle = ffi.gc(out[0], lib.ei_model_free)
        for name, info in gguf.tensors.items():
            layer, role = self._role(name)
            if role is None:
                continue
            ne0 = info.shape[0]
            ne1 = info.shape[1] if len(info.shape) > 1 else 1
            ptr = ffi.from_buffer(info.data)
            check(lib.ei_model_set_tensor(self.handle, layer, role, ptr, info.type, ne0, ne1), f"tensor {name}")
        check(lib.ei_model_finalize(self.handle), "model_finalize")

    @staticmethod
    def _role(name: str) -> tuple[int, int | None]:
        if name in GLOBAL_ROLES:
            return -1, GLOBAL_ROLES[name]
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
            return int(parts[1]), LAYER_ROLES.get(parts[2])
        return -1, None
