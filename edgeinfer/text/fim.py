"""Fill in the middle: the prompt a code model continues with the text between a prefix and a
suffix, built from the vocabulary's FIM tokens (found as llama.cpp finds them: `vocab.py`).

Two forms:
- plain, as Qwen2.5-Coder's and StarCoder's model cards, Ollama's templates and OpenAI's
  `suffix` have it: [BOS] <PRE> prefix <SUF> suffix <MID>;
- repo-level, llama.cpp's /infill: files of the project first (<REPO> project name, then
  <SEP> file name and text per file, where the vocabulary has those tokens; a "--- snippet ---"
  line between texts where it has not), then <PRE> prefix + prompt <SUF> suffix <MID>, the
  prefix kept to its last 3/4 of a batch, the suffix to its first 1/4 and the files to what the
  context leaves past the batch and twice n_predict, newest last. llama.cpp's batch is 2,048
  tokens; here it is that or half the context, whichever is smaller (llama.cpp's own budget
  would leave no room for files in a context of 2,048 or less), and the files also leave
  n_predict tokens (at least one) free, where llama.cpp's can overflow the context.

Prefix, suffix and file texts are code, not markup: special-token texts in them stay text.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..errors import InfillError

__all__ = ["fim_ids", "supports_fim", "LLAMA_CPP_BATCH"]

#: llama.cpp's default batch (n_batch), which its /infill budget is measured in
LLAMA_CPP_BATCH = 2048
_SNIPPET = "\n\n--- snippet ---\n\n"      # between files, where the vocabulary has no <SEP>


def supports_fim(tok) -> bool:
    return None not in (tok.fim_pre_id, tok.fim_suf_id, tok.fim_mid_id)


def fim_ids(tok, prefix: str, suffix: str, *, prompt: str = "", files: Sequence[tuple[str, str]] | None = None,
            n_ctx: int | None = None, n_predict: int = 0) -> list[int]:
    """The prompt ids that ask `tok`'s model for the text between `prefix` and `suffix`.

    `files` None: the plain form. A list of (file name, text), even empty: the repo-level form
    of llama.cpp's /infill, budgeted against `n_ctx` and `n_predict` as the module says,
    `prompt` (the start of the line being completed) after the prefix. InfillError when the vocabulary has no FIM
    tokens."""
    if not supports_fim(tok):
        raise InfillError("this model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
                          "<|fim_middle|> or the like): it was not trained to fill in code")

    def text(s: str) -> list[int]:
        return tok.encode(s, add_special=False, parse_special=False)

    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    head, pre, suf = [], text(prefix), text(suffix)
    if files is not None:
        batch = min(LLAMA_CPP_BATCH, (n_ctx or LLAMA_CPP_BATCH * 2) // 2)
        mid = tok.encode(prompt, add_special=False, parse_special=True) if prompt else []
        pre = pre[len(pre) - min(len(pre), 3 * (batch // 4)):] + mid
        suf = suf[:max(0, batch // 4 - (2 + len(mid)))]
        head = _repo_files(tok, files, text)
        rest = len(bos) + len(pre) + len(suf) + 3
        # llama.cpp's room for the files, and never more than leaves n_predict (at least one) free
        room = max(0, min((n_ctx or 0) - batch - 2 * n_predict, (n_ctx or 0) - rest - max(n_predict, 1)))
        head = head[len(head) - min(room, len(head)):]
    return head + bos + [tok.fim_pre_id] + pre + [tok.fim_suf_id] + suf + [tok.fim_mid_id]


def _repo_files(tok, files: Sequence[tuple[str, str]], text) -> list[int]:
    out: list[int] = []
    if tok.fim_rep_id is not None:
        out += [tok.fim_rep_id] + text("myproject\n")
    for name, body in files:
        out += [tok.fim_sep_id] + text(f"{name}\n") if tok.fim_sep_id is not None else text(_SNIPPET)
        out += text(body)
    if tok.fim_sep_id is not None:
        out += [tok.fim_sep_id] + text("filename\n")   # llama.cpp names the file being edited so
    return out
