"""Tokenizer metadata for GGUF (`tokenizer.ggml.*`, `tokenizer.chat_template`) from a
Hugging Face checkpoint:

* `tokenizer.model` (SentencePiece, read with the sentencepiece library) ->
  model "llama": pieces, scores, token types, add_space_prefix;
* otherwise `tokenizer.json` with a byte-level BPE model -> model "gpt2": tokens, merges,
  token types and the pre-tokenizer name llama.cpp knows the same regexes by (the table in
  edgeinfer/text/pretokenizers.py).

Special tokens and add_bos/add_eos come from tokenizer_config.json (then tokenizer.json's
post-processor, config.json and generation_config.json); the chat template from
tokenizer_config.json or chat_template.jinja / chat_template.json.
"""
from __future__ import annotations

import json
import re
from typing import Any

from ..errors import ConversionError
from ..text.pretokenizers import PRE_TOKENIZERS
from .checkpoint import Checkpoint, read_json

__all__ = ["SUPPORTED_PRE_TOKENIZERS", "tokenizer_metadata"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
#: Gemma 4's channel, tool and quote tokens: always rendered, so a chat parser sees them (llama.cpp)
GEMMA4_VISIBLE = frozenset({"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                            "<tool_response|>", '<|"|>'})

# what the converter can name: the table entries that say how tokenizer.json spells them
_HF_FORMS = {name: pre.hf for name, pre in PRE_TOKENIZERS.items() if pre.hf is not None}
SUPPORTED_PRE_TOKENIZERS = tuple(f"{name} ({hf.description})" for name, hf in _HF_FORMS.items())


# ------------------------------------------------------------------ helpers
def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def _pre_name(tj: dict, architectures: Any = ()) -> str:
    """The GGUF ``tokenizer.ggml.pre`` name of tokenizer.json's pre-tokenizer; among entries of
    the same form, the one listing one of config.json's ``architectures``, else the first."""
    pre = tj.get("pre_tokenizer")
    items = []
    if isinstance(pre, dict):
        items = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not isinstance(items, list) or not all(isinstance(p, dict) for p in items):
        items = []
    steps = tuple(p.get("type") for p in items)
    split = next((p for p in items if p.get("type") == "Split"), None)
    split_regex = None
    if split is not None and split.get("behavior") == "Isolated":
        split_regex = (split.get("pattern") or {}).get("Regex")
    digits_ok = all(p.get("individual_digits") for p in items if p.get("type") == "Digits")
    # ByteLevel runs the gpt-2 regex itself exactly when no Split came first
    byte_level_ok = bool(steps) and steps[-1] == "ByteLevel" and (
        items[-1].get("use_regex", True) == (split is None))
    if digits_ok and byte_level_ok:
        names = [name for name, hf in _HF_FORMS.items()
                 if hf.steps == steps and hf.split_regex == split_regex]
        archs = ({a for a in architectures if isinstance(a, str)}
                 if isinstance(architectures, (list, tuple)) else set())
        for name in names:
            if archs & set(_HF_FORMS[name].architectures):
                return name
        if names:   # the plain entry of that form
            return next((n for n in names if not _HF_FORMS[n].architectures), names[0])
    raise ConversionError(
        f"tokenizer.json: pre-tokenizer {json.dumps(pre)[:300]} has no llama.cpp equivalent "
        f"this converter knows; supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}")


def _post_ends(tj: dict, text_to_id: dict[str, int]) -> tuple[int | None, int | None] | None:
    """The ids of the special tokens tokenizer.json's post-processor puts first and last around a
    single text (None at an end that is the text), as llama.cpp's converter reads its
    TemplateProcessing (the last one, a template of at least two entries); None without one."""
    pp = tj.get("post_processor")
    procs = (pp.get("processors", [pp]) if isinstance(pp, dict) else [])
    ends = None
    for p in procs:
        single = p.get("single") if isinstance(p, dict) and p.get("type") == "TemplateProcessing" else None
        if single is None:
            continue
        specials = p.get("special_tokens") or {}

        def tok_id(item) -> int | None:
            name = (item.get("SpecialToken") or {}).get("id") if isinstance(item, dict) else None
            ids = (specials.get(name) or {}).get("ids") or ([text_to_id[name]] if name in text_to_id else [])
            return ids[0] if name is not None and ids else None
        ends = (tok_id(single[0]), tok_id(single[-1])) if len(single) > 1 else (None, None)
    return ends


def _read_spm(path: str) -> dict:
    """Pieces, scores, token types, special ids and add_dummy_prefix of a SentencePiece model.

    SentencePieceProcessor reports normal / unknown / control / byte / unused pieces but has
    no USER_DEFINED query; like llama.cpp's convert_hf_to_gguf.py, such pieces come out NORMAL
    here and are re-typed from the Hugging Face added-token lists (see tokenizer_metadata)."""
    try:
        import sentencepiece
    except ImportError:  # an optional extra, like safetensors (checkpoint.py)
        raise ConversionError(f"{path}: reading a SentencePiece model needs sentencepiece: "
                              "pip install 'edgeinfer[convert]'") from None

    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.load(path)
    except (OSError, RuntimeError) as e:
        raise ConversionError(f"{path}: not a SentencePiece model ({e})") from None
    n = sp.get_piece_size()
    if n == 0:
        raise ConversionError(f"{path}: no pieces: not a SentencePiece model")
    pieces, scores, types = [], [], []
    for i in range(n):
        pieces.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        types.append(UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i)
                     else UNUSED if sp.is_unused(i) else BYTE if sp.is_byte(i) else NORMAL)
    # the normalizer prepends U+2581 to every text exactly when add_dummy_prefix is set
    return {"pieces": pieces, "scores": scores, "types": types,
            "unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id(),
            "add_dummy_prefix": sp.normalize("x").startswith("\u2581")}


def _chat_template(ckpt: Checkpoint, tcfg: dict) -> str | None:
    t = tcfg.get("chat_template")
    if isinstance(t, list):
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default") or next(iter(named.values()), None)
    if isinstance(t, str) and t:
        return t
    p = ckpt.file("chat_template.jinja")
    if p:
        with open(p, encoding="utf-8") as fh:
            return fh.read()
    j = ckpt.json_file("chat_template.json")
    if isinstance(j, dict) and isinstance(j.get("chat_template"), str):
        return j["chat_template"]
    return None


# ------------------------------------------------------------------ main entry
def tokenizer_metadata(ckpt: Checkpoint, n_vocab: int) -> list[tuple[str, Any, str | None]]:
    """(key, value, value type) triples of the tokenizer metadata for a model of n_vocab."""
    tcfg = ckpt.json_file("tokenizer_config.json") or {}
    spm_path = ckpt.file("tokenizer.model")
    tj_path = ckpt.file("tokenizer.json")
    kv: list[tuple[str, Any, str | None]] = []
    text_to_id: dict[str, int] = {}
    if spm_path:
        spm = _read_spm(spm_path)
        tokens, scores, types = spm["pieces"], spm["scores"], spm["types"]
        # added tokens beyond the SentencePiece vocabulary
        added = []
        if tj_path:
            added = [(a["id"], a["content"], a.get("special", False))
                     for a in read_json(tj_path, "tokenizer.json").get("added_tokens", [])]
        elif ckpt.file("added_tokens.json"):
            added = [(i, c, True) for c, i in ckpt.json_file("added_tokens.json").items()]
        for i, content, special in sorted(added):
            if i < len(tokens):
                if tokens[i] != content:
                    raise ConversionError(f"added token {content!r} has id {i}, which "
                                          f"tokenizer.model gives to {tokens[i]!r}")
                if types[i] == NORMAL:      # a user-defined piece (see _read_spm)
                    types[i] = CONTROL if special else USER_DEFINED
                continue
            while len(tokens) < i:
                tokens.append(f"[PAD{len(tokens)}]"); scores.append(-1000.0)
                types.append(UNUSED)
            tokens.append(content); scores.append(-1000.0)
            types.append(CONTROL if special else USER_DEFINED)
        model = "llama"
        special_ids = {"bos": spm["bos"], "eos": spm["eos"], "unk": spm["unk"],
                       "pad": spm["pad"]}
        default_bos = True
        kv.append(("tokenizer.ggml.add_space_prefix", spm["add_dummy_prefix"], "BOOL"))
        tj = read_json(tj_path, "tokenizer.json") if tj_path else {}
    elif tj_path:
        tj = read_json(tj_path, "tokenizer.json")
        m = tj.get("model") or {}
        if m.get("type") != "BPE" or not isinstance(m.get("vocab"), dict):
            raise ConversionError(f"{tj_path}: tokenizer model {m.get('type')!r} is not "
                                  f"supported (byte-level BPE tokenizer.json, or a "
                                  f"SentencePiece tokenizer.model)")
        gemma4 = m.get("byte_fallback") and "gemma4" in str(ckpt.config.get("model_type", ""))
        if m.get("byte_fallback") and not gemma4:
            raise ConversionError(f"{tj_path}: SentencePiece-style BPE (byte_fallback) needs "
                                  f"the checkpoint's tokenizer.model")
        pre = None if gemma4 else _pre_name(tj, ckpt.config.get("architectures", ()))
        vocab = m["vocab"]
        size = max([*vocab.values(), *(a["id"] for a in tj.get("added_tokens", []))]) + 1
        tokens = [None] * size
        types = [NORMAL] * size
        for t, i in vocab.items():
            tokens[i] = t
        for a in tj.get("added_tokens", []):
            tokens[a["id"]] = a["content"]
            types[a["id"]] = CONTROL if a.get("special") else USER_DEFINED
        for i, t in enumerate(tokens):
            if t is None:
                tokens[i] = f"[PAD{i}]"
                types[i] = USER_DEFINED
        merges = []
        for mg in m.get("merges", []):
            merges.append(mg if isinstance(mg, str) else " ".join(mg))
        scores = None
        model = "gpt2"
        if gemma4:      # metaspace BPE with <0xXX> byte fallback, as llama.cpp's converter writes it
            model, scores, default_bos = "gemma4", [-1000.0] * len(tokens), True
            for i, t in enumerate(tokens):
                if re.fullmatch(r"<0x[0-9A-F]{2}>", t) and t in vocab:
                    types[i] = BYTE
                elif t in GEMMA4_VISIBLE:
                    types[i] = USER_DEFINED
            kv.append(("tokenizer.ggml.merges", merges, "STRING"))
            kv.append(("tokenizer.ggml.add_space_prefix", False, "BOOL"))
        else:
            kv.append(("tokenizer.ggml.pre", pre, "STRING"))
            kv.append(("tokenizer.ggml.merges", merges, "STRING"))
            default_bos = False
        special_ids = {}
    else:
        raise ConversionError(f"{ckpt.dir}: no tokenizer (tokenizer.json or tokenizer.model)")

    if len(tokens) > n_vocab:
        raise ConversionError(f"the tokenizer has {len(tokens)} tokens but the model's "
                              f"vocab_size is {n_vocab}")
    while len(tokens) < n_vocab:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(USER_DEFINED if model == "gpt2" else UNUSED)
        if scores is not None:
            scores.append(-1000.0)
    for i, t in enumerate(tokens):
        text_to_id.setdefault(t, i)

    # special tokens: tokenizer_config.json, then config.json / generation_config.json
    for role in ("bos", "eos", "unk", "pad"):
        text = _token_text(tcfg.get(f"{role}_token"))
        if text is not None:
            if text not in text_to_id:
                raise ConversionError(f"tokenizer_config.json: {role}_token {text!r} is not in "
                                      f"the vocabulary")
            special_ids[role] = text_to_id[text]
    for src in (ckpt.config, ckpt.json_file("generation_config.json") or {}):
        for role in ("bos", "eos", "pad"):
            v = src.get(f"{role}_token_id")
            if isinstance(v, list):
                v = v[0] if v else None
            if isinstance(v, int) and special_ids.get(role, -1) < 0:
                special_ids[role] = v
    # a post-processor that appends a special token other than the configured EOS (Qwen3-Embedding's
    # <|endoftext|> after every text): that token is the EOS the tokenizer adds, and the configured
    # one becomes the end of turn, as llama.cpp's converter reads such a tokenizer
    ends = _post_ends(tj, text_to_id)
    first, last = ends or (None, None)
    if tcfg and last is not None and last != special_ids.get("eos"):
        if special_ids.get("eos") is not None:
            special_ids["eot"] = special_ids["eos"]
        special_ids["eos"] = last
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
                      ("unk", "unknown_token_id"), ("pad", "padding_token_id")):
        v = special_ids.get(role)
        if isinstance(v, int) and 0 <= v < n_vocab:
            kv.append((f"tokenizer.ggml.{key}", v, "UINT32"))

    # the configured flags, else the post-processor's template (its first and last entries); a
    # template that appends the EOS wins, as in llama.cpp's converter
    add_bos = tcfg.get("add_bos_token")
    if not isinstance(add_bos, bool):
        add_bos = default_bos if ends is None else first is not None and first == special_ids.get("bos")
    add_eos = tcfg.get("add_eos_token")
    if last is not None and last == special_ids.get("eos"):
        add_eos = True
    elif not isinstance(add_eos, bool):
        add_eos = False
    kv += [("tokenizer.ggml.add_bos_token", bool(add_bos), "BOOL"),
           ("tokenizer.ggml.add_eos_token", bool(add_eos), "BOOL")]

    head = [("tokenizer.ggml.model", model, "STRING"),
            ("tokenizer.ggml.tokens", tokens, "STRING")]
    if scores is not None:
        head.append(("tokenizer.ggml.scores", scores, "FLOAT32"))
    head.append(("tokenizer.ggml.token_type", types, "INT32"))
    tmpl = _chat_template(ckpt, tcfg)
    tail = [("tokenizer.chat_template", tmpl, "STRING")] if tmpl else []
    return head + kv + tail
