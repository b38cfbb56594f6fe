"""Qwen3-Reranker checkpoints: a Qwen3 causal LM whose relevance score is the probability of
"yes" against "no" after its prompt. Converted as llama.cpp converts them, so either runtime
reranks with the file: the LM head's "yes" and "no" rows become the classification head
`cls.output.weight`, the pooling type is "rank", the labels are ["yes", "no"] and the prompt is
the rerank template. Unlike llama.cpp's converter, an untied LM head is kept: the file still
generates text."""
from __future__ import annotations

import os
from dataclasses import dataclass

from gguf.constants import Keys

from ..errors import ConversionError
from ..arch.table import POOLING_TYPES, RANK_HEAD_WEIGHT
from ..text.rerank import QWEN3_TEMPLATE, TEMPLATE_KEY
from .arch import HParams
from .checkpoint import Checkpoint

LABELS = ("yes", "no")


@dataclass
class RerankHead:
    rows: tuple[int, ...]       # the token ids whose LM-head rows make the head, in label order
    source: str                 # the checkpoint tensor holding those rows
    gguf: str = RANK_HEAD_WEIGHT

    def metadata(self, hp: HParams) -> list[tuple[str, object, str]]:
        key = f"{hp.arch.name}.{{}}".format
        return [(key("pooling_type"), POOLING_TYPES["rank"], "UINT32"),
                (key("classifier.output_labels"), list(LABELS), "STRING"),
                (TEMPLATE_KEY, QWEN3_TEMPLATE, "STRING"),
                (Keys.Tokenizer.CHAT_TEMPLATES, ["rerank"], "STRING")]   # the named templates, as llama.cpp lists them


def is_qwen3_reranker(ckpt: Checkpoint) -> bool:
    """llama.cpp's test: the model card's title, or the folder's, path's, type's or class's name."""
    card = ckpt.file("README.md")
    if card is not None:
        with open(card, encoding="utf-8", errors="replace") as f:
            if "# qwen3-reranker" in f.read().lower():
                return True
    cfg = ckpt.config
    archs = cfg.get("architectures") or [""]
    hints = [os.path.basename(os.path.abspath(ckpt.dir)), cfg.get("_name_or_path"), cfg.get("model_type"), archs[0]]
    return any("qwen3-reranker" in str(h).lower() for h in hints if h)


def rerank_head(ckpt: Checkpoint, hp: HParams, tok_kv: list) -> RerankHead | None:
    """The head to write for a Qwen3-Reranker checkpoint, None for any other."""
    if hp.arch.name != "qwen3" or not is_qwen3_reranker(ckpt):
        return None
    tokens = next((v for k, v, _ in tok_kv if k == Keys.Tokenizer.LIST), [])
    index = {t: i for i, t in enumerate(tokens)}
    missing = [t for t in LABELS if t not in index]
    if missing:
        raise ConversionError(f"{ckpt.dir}: a Qwen3-Reranker's vocabulary needs the tokens "
                              f"{list(LABELS)}; {missing} are not in it")
    role = "token_embd" if hp.tied_output else "output"
    source = next(t.hf for t in hp.arch.tensors if t.role == role)
    return RerankHead(tuple(index[t] for t in LABELS), source)
