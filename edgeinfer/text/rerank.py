"""The prompt a reranker scores for a (query, document) pair, as llama.cpp's server builds it for
a decoder reranker: the file's rerank template (`tokenizer.chat_template.rerank`, plain text with
`{query}` and `{document}`) tokenized with its special tokens parsed and nothing added."""
from __future__ import annotations

from typing import Mapping

from ..errors import RerankError
from .tokenizer import Tokenizer

TEMPLATE_KEY = "tokenizer.chat_template.rerank"

#: Qwen3-Reranker's prompt (its model card's, with the card's default instruction), which the
#: converter writes as llama.cpp's converter does.
QWEN3_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def rerank_template(metadata: Mapping) -> str | None:
    t = metadata.get(TEMPLATE_KEY)
    return t if isinstance(t, str) and t else None


def rerank_ids(tok: Tokenizer, template: str | None, query: str, document: str) -> list[int]:
    """The token ids of one pair's prompt. RerankError without a template: llama.cpp's pair form
    without one ([BOS] query [EOS] [SEP] document [EOS]) is an encoder's, which edgeinfer does
    not run."""
    if template is None:
        raise RerankError(f"the model file has no rerank template ({TEMPLATE_KEY!r})")
    # {query} then {document}, as llama.cpp replaces them; special tokens in the texts parse too
    text = template.replace("{query}", query).replace("{document}", document)
    return tok.encode(text, add_special=False, parse_special=True)
