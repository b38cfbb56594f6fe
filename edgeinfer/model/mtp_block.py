"""Qwen3.5's MTP block as an ei_model of one layer (engine/mtp.py drafts with it)."""
from __future__ import annotations

import dataclasses

from .._native import check, ffi, lib
from ..gguf.reader import GGUFFile
from .config import ModelConfig
from .native_model import c_role, fill_config

_NEXTN_INPUTS = {"nextn_eh_proj": "EI_NEXTN_EH_PROJ", "nextn_enorm": "EI_NEXTN_ENORM",
                 "nextn_hnorm": "EI_NEXTN_HNORM"}


def block_config(cfg: ModelConfig) -> ModelConfig:
    """The one-layer model the first MTP block runs as: a full (gated) attention layer of the
    trunk's sizes, no recurrent layers."""
    if cfg.n_mtp < 1:
        raise ValueError(f"speculative='mtp' needs a model file with its MTP block; this {cfg.arch} file has none "
                         f"(nextn_predict_layers = 0)")
    return dataclasses.replace(cfg, n_layer=1, layer_kinds=("attention",), n_mtp=0, conv_kernel=0,
                               ssm_head_dim=0, ssm_k_heads=0, ssm_v_heads=0)


class MtpBlockModel:
    """An ei_model of the block: its layer's tensors as layer 0, its input tensors, its
    shared_head_norm as the final norm, the trunk's token embedding and head."""

    def __init__(self, gguf: GGUFFile, cfg: ModelConfig, trunk_runtime):
        self.gguf = gguf            # keeps the mmap alive
        self.cfg = block_config(cfg)
        self.trunk = trunk_runtime  # its packed head is read by this model's runtime
        c = ffi.new("ei_model_config *")
        fill_config(c, self.cfg)
        out = ffi.new("ei_model **")
        check(lib.ei_model_create(c, out), "model_create (MTP block)")
        self.handle = ffi.gc(out[0], lib.ei_model_free)
        block = cfg.n_layer
        for w in cfg.weights():
            if w.name not in gguf.tensors or (w.layer >= 0 and w.layer != block):
                continue
            info = gguf.tensors[w.name]
            role = w.tensor.role
            if w.tensor.split:
                raise ValueError(f"MTP block tensor {w.name}: fused tensors are not supported here")
            ne0 = info.shape[0]
            ne1 = info.shape[1] if len(info.shape) > 1 else 1
            ptr = ffi.from_buffer(info.data)
            if role == "output_norm":
                continue                                # the block's own norm takes its place
            if role == "nextn_shared_head_norm":
                layer, role = -1, "output_norm"
            elif role in _NEXTN_INPUTS:
                check(lib.ei_model_set_nextn(self.handle, getattr(lib, _NEXTN_INPUTS[role]), ptr, info.type, ne0, ne1),
                      f"tensor {w.name}")
                continue
            else:
                layer = -1 if w.layer < 0 else 0
            check(lib.ei_model_set_tensor(self.handle, layer, c_role(role), ptr, info.type, ne0, ne1),
                  f"tensor {w.name}")
        check(lib.ei_model_share_head(self.handle, trunk_runtime.handle), "share_head")
        check(lib.ei_model_finalize(self.handle), "model_finalize (MTP block)")


__all__ = ["MtpBlockModel", "block_config"]
