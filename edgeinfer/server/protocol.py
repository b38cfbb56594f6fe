"""OpenAI (and Anthropic Messages) request bodies as pydantic models, and the error object:
every bad field gives a 400 naming it. Fields a client sends that we do not know are ignored,
as OpenAI's are.

Sampling defaults are OpenAI's (temperature 1, top_p 1, no top-k, no min-p); the
extensions `top_k`, `min_p`, `repeat_penalty` and `ignore_eos` are accepted as well.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import (AliasChoices, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, TypeAdapter,
                      ValidationError, WithJsonSchema)
from pydantic_core import PydanticCustomError

from ..engine import EFFORT_BUDGETS

__all__ = ["APIError", "bad", "GenRequest", "parse_chat", "parse_completion", "parse",
           "TokenizeBody", "DetokenizeBody", "MessagesBody", "CountTokensBody", "EmbeddingsBody", "LlamaCppBody",
           "RerankBody"]


class APIError(Exception):
    """An error answered as OpenAI's `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# --------------------------------------------------------------------------- models

class _Body(BaseModel):
    # strict: no coercion ("1" is not 1, true is not 1); JSON's NaN/Infinity are refused
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False, frozen=True)


def _text_parts(v: Any) -> Any:
    """Message content: None is "", a list of text parts is their concatenation."""
    if v is None:
        return ""
    if isinstance(v, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in v):
            raise PydanticCustomError("invalid_type", 'must be a string or a list of text parts '
                                                      '{"type": "text", "text": ...}')
        return "".join(p["text"] for p in v)
    return v


def _stop_list(v: Any) -> Any:
    return [v] if isinstance(v, str) else v


class TextPart(_Body):
    type: Literal["text"]
    text: str


# What the before-validators take, for the JSON Schema (they normalise it to the field's type)
_Content = Annotated[str, BeforeValidator(_text_parts, json_schema_input_type=str | list[TextPart] | None)]
_Stops = Annotated[list[str], Field(max_length=4)]   # OpenAI's limit
_Stop = Annotated[_Stops | None, BeforeValidator(_stop_list, json_schema_input_type=str | _Stops | None)]
_TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
# A string, token ids, or a batch of those (parse_completion reads it)
MAX_CHOICES = 128    # a completions request's prompts times their n choices
_PROMPT_SCHEMA = TypeAdapter(str | _TokenIds | Annotated[list[str | _TokenIds], Field(min_length=1,
                                                                                       max_length=MAX_CHOICES)]
                             ).json_schema()
_ONE_PROMPT_SCHEMA = TypeAdapter(str | _TokenIds | Annotated[list[str | _TokenIds], Field(min_length=1, max_length=1)]
                                 ).json_schema()


class CalledFunction(_Body):
    name: str
    arguments: str | dict = "{}"             # OpenAI sends JSON text; an object is taken too


class ToolCall(_Body):
    id: str = ""
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: _Content = ""
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None          # a tool result answers this call
    name: str | None = None
    reasoning_content: str | None = None     # an assistant's earlier thinking: the template keeps or drops it


class StreamOptions(_Body):
    include_usage: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict | None = None


class LoraRef(_Body):
    """One adapter of a request's `lora` list (llama.cpp's per-request field): its id (GET
    /lora-adapters) or its name, and its scale."""
    id: int | None = None
    name: str | None = None
    scale: float = Field(1.0, ge=-100.0, le=100.0)


class _GenBody(_Body):
    model: str | None = None
    lora: list[LoraRef] | None = None    # LoRA adapters for this request (beside a `model` naming one)
    n: int | None = Field(None, ge=1, le=16)     # choices per request: sibling sequences
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = None
    ignore_eos: bool | None = None
    stop: _Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logit_bias: dict | None = None
    response_format: ResponseFormat | None = None
    json_schema: dict | None = None    # llama.cpp's server extensions: a JSON Schema, or
    grammar: str | None = None         # a GBNF (or Lark) grammar the output follows
    # OpenAI fields we accept but do not act on: checked for type only
    user: str | None = None
    metadata: dict | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None


class ChatBody(_GenBody):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    functions: Any = None
    # extra variables for the chat template (vLLM / llama-server style), e.g. Qwen3's thinking switch
    chat_template_kwargs: dict[str, Any] | None = None
    enable_thinking: bool | None = None
    # thinking budget of templates with a thinking block: OpenAI's effort, or (extension) tokens
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    reasoning_budget: int | None = Field(None, ge=0)


class CompletionBody(_GenBody):
    # read by parse_completion, which names the field in its errors; required: null or missing is a 400
    model_config = ConfigDict(json_schema_extra=lambda schema: (schema.setdefault("required", []).append("prompt"),
                                                                schema["properties"]["prompt"].pop("default")))
    prompt: Annotated[Any, WithJsonSchema(_PROMPT_SCHEMA)] = None
    max_tokens: int | None = Field(None, ge=0)  # omitted or null: until EOS or a full context
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = None                     # the prompt comes back before the completion
    suffix: str | None = None                    # fill in the middle: the text after the gap
    best_of: int | None = Field(None, ge=1)


class TokenizeBody(_Body):
    """POST /tokenize: llama-server's fields, and vLLM's names for them (`prompt`,
    `add_special_tokens`)."""
    content: str = Field(validation_alias=AliasChoices("content", "prompt"))
    add_special: bool = Field(True, validation_alias=AliasChoices("add_special", "add_special_tokens"))
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(_Body):
    tokens: list[int]


class SlotBody(_Body):
    """POST /slots/{id_slot}: the file, a plain name inside --prompt-cache DIR (save, restore)."""
    filename: str | None = None


class LoraLoadBody(_Body):
    """POST /v1/lora-adapters: a name for the adapter, and its path relative to --lora-dir (a PEFT
    folder or a LoRA GGUF file there; never outside it)."""
    name: str = Field(min_length=1, max_length=64)
    path: str = Field(min_length=1, max_length=1024)


_MAX_EMBED_INPUTS = 2048   # OpenAI's limit of inputs per request


class EmbeddingsBody(_Body):
    """POST /v1/embeddings (OpenAI's): a string, token ids, or a batch of either."""
    input: (Annotated[str, Field(min_length=1)]
            | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=_MAX_EMBED_INPUTS)]
            | _TokenIds | Annotated[list[_TokenIds], Field(min_length=1, max_length=_MAX_EMBED_INPUTS)])
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)   # only the model's own width: no truncation
    user: str | None = None

    def items(self) -> list[str | list[int]]:
        """The inputs, one per embedding."""
        x = self.input
        return [x] if isinstance(x, str) or isinstance(x[0], int) else list(x)


_MAX_RERANK_DOCUMENTS = 1000    # Cohere's advice: no more a request


class RerankDocument(_Body):
    """A document as an object (Jina's and Cohere v1's form): its text."""
    text: str


class RerankBody(_Body):
    """POST /rerank and its aliases (llama-server's, Jina's, Cohere's, vLLM's): `documents` ranked by
    relevance to `query`; `texts` instead of `documents` asks for Hugging Face TEI's reply (a bare list)."""
    query: str
    documents: Annotated[list[str | RerankDocument], Field(min_length=1, max_length=_MAX_RERANK_DOCUMENTS)] | None = None
    texts: Annotated[list[str], Field(min_length=1, max_length=_MAX_RERANK_DOCUMENTS)] | None = None
    model: str | None = None
    top_n: int | None = Field(None, ge=1)           # the best n results only (default: all)
    return_documents: bool = False                  # each result carries its `document` (Jina, Cohere v1)
    return_text: bool = False                       # each TEI result carries its `text`
    max_tokens_per_doc: int | None = Field(None, ge=1)   # documents cut to their first n tokens (Cohere v2)
    truncate: bool = False          # documents cut to what fits the context (TEI), else a 400
    raw_scores: bool = False        # TEI's scores before the sigmoid: not given (a 400)

    def texts_ranked(self) -> list[str]:
        """The documents' texts; a 400 naming the field unless exactly one of the two lists is given."""
        if self.raw_scores:
            raise bad("raw_scores is not supported: the score is the head's probability", "raw_scores",
                      "unsupported_value")
        if (self.documents is None) == (self.texts is None):
            raise bad("give the documents to rank as `documents` (or TEI's `texts`), one of the two", "documents")
        return list(self.texts) if self.texts is not None else [d if isinstance(d, str) else d.text
                                                                 for d in self.documents]


M = TypeVar("M", bound=BaseModel)


# The names pydantic puts in an error's location for the member of a union it tried
# ('constrained-str', 'list[constrained-int]', a model's class name): not fields of the request.
_UNION_MEMBER = re.compile(r"[a-z-]+\[.*\]|constrained-[a-z]+|str|int|float|bool|none")


def _is_union_member(part: Any) -> bool:
    return isinstance(part, str) and (_UNION_MEMBER.fullmatch(part) is not None or part in _BODY_NAMES)


def _field_loc(loc: tuple) -> tuple:
    return tuple(p for p in loc if not _is_union_member(p))


def _param(loc: tuple) -> str | None:
    """('messages', 0, 'role') -> 'messages[0].role'; union members' names left out."""
    out = ""
    for part in _field_loc(loc):
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _most_telling(errors: list[dict]) -> dict:
    """The error to report: where a value fails every member of a union, pydantic lists one
    error per member; the member that took the value's shape says what is wrong with it (a
    constraint rather than a type, then the deepest location, then the furthest item), the
    others only that it is not their type. Otherwise the first error."""
    def rank(err: dict) -> tuple:
        loc = _field_loc(err["loc"])
        return (not err["type"].endswith("_type"), len(loc), [p for p in loc if isinstance(p, int)])
    best = errors[0]
    for err in errors[1:]:
        if rank(err) > rank(best):
            best = err
    return best


def parse(model: type[M], body: Any) -> M:
    """Validates a decoded JSON body; APIError 400 naming the bad field."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = _most_telling(e.errors(include_url=False))
        param = _param(err["loc"])
        kind = err["type"]
        if kind == "missing":
            raise bad(f"'{param}' is required", param, "missing_required_parameter") from None
        code = "invalid_type" if kind.endswith("_type") else "invalid_value"
        got = f", got {err['input']!r}" if code == "invalid_value" else \
            f", got {type(err['input']).__name__}"
        raise bad(f"'{param}': {err['msg']}{got}", param, code) from None


# --------------------------------------------------------------------------- requests

@dataclass
class GenRequest:
    kind: str                               # "chat" | "completion"
    model: str | None
    messages: list[dict] | None = None      # chat
    prompt_text: str | None = None          # completion, text
    prompt_ids: list[int] | None = None     # completion, token ids
    max_tokens: int | None = None           # None: until EOS or the context is full
    sampling: dict = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    n_logprobs: int | None = None           # None: no logprobs; else alternatives per token
    n: int = 1                              # choices (sibling sequences of one prompt)
    constraint: dict = field(default_factory=dict)   # structured output as given: grammar_spec's
                                            # response_format / json_schema / grammar
    tools: list[dict] | None = None         # chat: functions the model may call
    tool_choice: Any = None
    template_kwargs: dict = field(default_factory=dict)   # chat: extra chat-template variables
    reasoning_budget: int | None = None     # chat: most tokens of the thinking block (None: no bound)
    lora: list[dict] = field(default_factory=list)   # LoRA adapters: {"id" or "name", "scale"}
    adapter: str | None = None              # `model` named this LoRA adapter: the reply's model
    responses: Any = None                   # /v1/responses: its ResponsesCall (what it repeats and keeps)
    # Ollama's way with the context: max_tokens is a bound, cut to the room the prompt leaves,
    # and (trim_turns) a chat's oldest exchanges after the system messages give way until it fits
    bound_max_tokens: bool = False
    trim_turns: bool = False
    # fill in the middle: Engine.infill_ids's arguments (prefix, suffix, and for llama.cpp's
    # /infill prompt and files); the prompt is then built from them, not from prompt_text
    fim: dict | None = None
    echo: bool = False                      # completion: the prompt (and its logprobs) before the reply
    batch: list["GenRequest"] | None = None  # completion of several prompts: each one's request
    llama: dict = field(default_factory=dict)   # llama-server's routes: return_tokens, response_fields, ...


def _request(kind: str, b: _GenBody) -> GenRequest:
    """The request fields chat and completions share."""
    sampling = {
        "temperature": 1.0 if b.temperature is None else b.temperature,
        "top_p": 1.0 if b.top_p is None else b.top_p,
        "top_k": b.top_k or 0,
        "min_p": b.min_p or 0.0,
        "repeat_penalty": 1.0 if b.repeat_penalty is None else b.repeat_penalty,
        "presence_penalty": b.presence_penalty or 0.0,
        "frequency_penalty": b.frequency_penalty or 0.0,
        # OpenAI allows negative seeds; numpy wants >= 0
        "seed": None if b.seed is None else b.seed & 0xFFFF_FFFF_FFFF_FFFF,
        "stop": [s for s in b.stop or [] if s],
        "ignore_eos": bool(b.ignore_eos),
        "logit_bias": b.logit_bias or None,   # checked against the vocabulary by the server
    }
    constraint = {k: v for k, v in (("json_schema", b.json_schema), ("grammar", b.grammar)) if v is not None}
    if b.response_format is not None and b.response_format.type != "text":
        constraint["response_format"] = b.response_format.model_dump(exclude_none=True)
    return GenRequest(kind=kind, model=b.model, sampling=sampling, stream=bool(b.stream), n=b.n or 1,
                      include_usage=bool(b.stream_options and b.stream_options.include_usage),
                      constraint=constraint, lora=lora_refs(b.lora))


def lora_refs(refs: list[LoraRef] | None) -> list[dict]:
    out = []
    for r in refs or []:
        if (r.id is None) == (r.name is None):
            raise bad("each 'lora' entry names its adapter by 'id' or by 'name' (one of them)", "lora",
                      "invalid_value")
        out.append({"id": r.id, "scale": r.scale} if r.id is not None else {"name": r.name, "scale": r.scale})
    return out


def parse_chat(body: Any) -> GenRequest:
    b = parse(ChatBody, body)
    req = _request("chat", b)
    req.messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.content,
                     **({"tool_calls": [c.model_dump() for c in m.tool_calls]} if m.tool_calls else {}),
                     **{k: v for k, v in (("tool_call_id", m.tool_call_id), ("name", m.name),
                                          ("reasoning_content", m.reasoning_content)) if v is not None}}
                    for m in b.messages]
    req.reasoning_budget = (b.reasoning_budget if b.reasoning_budget is not None
                            else EFFORT_BUDGETS[b.reasoning_effort] if b.reasoning_effort else None)
    req.max_tokens = b.max_completion_tokens or b.max_tokens
    if b.top_logprobs is not None and not b.logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value")
    if b.logprobs:
        req.n_logprobs = b.top_logprobs or 0
    req.template_kwargs = dict(b.chat_template_kwargs or {})
    if b.enable_thinking is not None:
        req.template_kwargs["enable_thinking"] = b.enable_thinking
    if b.functions:
        raise bad("'functions' is not supported: use 'tools'", "functions", "unsupported_parameter")
    if b.tool_choice is not None and not b.tools and b.tool_choice != "none":
        raise bad("'tool_choice' needs 'tools'", "tool_choice", "invalid_value")
    req.tools, req.tool_choice = b.tools or None, b.tool_choice
    return req


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in v)


def parse_completion(body: Any, n_vocab: int) -> GenRequest:
    b = parse(CompletionBody, body)
    prompt = b.prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        return _batch(body, prompt, b.n or 1, n_vocab)
    req = _request("completion", b)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]          # a batch of one prompt
    if isinstance(prompt, str):
        req.prompt_text = prompt
    elif _is_ids(prompt):
        bad_ids = [t for t in prompt if not 0 <= t < n_vocab]
        if bad_ids:
            raise bad(f"token id {bad_ids[0]} in 'prompt' is outside the vocabulary [0, {n_vocab})",
                      "prompt", "invalid_token")
        req.prompt_ids = list(prompt)
    else:
        raise bad("'prompt' must be a string or a non-empty list of token ids", "prompt", "invalid_type")
    req.max_tokens = b.max_tokens
    req.n_logprobs = b.logprobs
    req.echo = bool(b.echo)
    if b.echo and b.suffix:
        raise bad("'echo' and 'suffix' cannot be used together", "echo", "invalid_value")
    if b.suffix:
        if req.prompt_text is None:
            raise bad("with a 'suffix', 'prompt' must be text (the code before the gap)", "prompt", "invalid_type")
        req.fim = {"prefix": req.prompt_text, "suffix": b.suffix}
        req.sampling["skip_special"] = True        # a stray marker is not code
    if b.best_of not in (None, 1):
        raise bad("'best_of' must be 1", "best_of", "unsupported_value")
    return req


def _batch(body: dict, prompts: list, n: int, n_vocab: int) -> GenRequest:
    """A completions request of several prompts: the first one's request, its `batch` each
    prompt's (choice i of prompt k at index k * n + i); a bad prompt's 400 names its index."""
    if len(prompts) * n > MAX_CHOICES:
        raise bad(f"{len(prompts)} prompts of {n} choices each are more than {MAX_CHOICES} choices", "prompt",
                  "unsupported_value")
    subs = []
    for k, p in enumerate(prompts):
        if not (isinstance(p, str) or _is_ids(p)):
            raise bad("each prompt of a list is a string or a non-empty list of token ids", f"prompt[{k}]",
                      "invalid_type")
        try:
            subs.append(parse_completion({**body, "prompt": p}, n_vocab))
        except APIError as e:
            e.param = f"prompt[{k}]" if e.param == "prompt" else e.param
            raise
    return dataclasses.replace(subs[0], batch=subs)


# --------------------------------------------------------------------------- Anthropic Messages

class AnthropicText(_Body):
    type: Literal["text"]
    text: str


class AnthropicToolUse(_Body):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class AnthropicToolResult(_Body):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[AnthropicText] = ""
    is_error: bool | None = None


class AnthropicThinking(_Body):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


_AnthropicBlock = Annotated[Union[AnthropicText, AnthropicToolUse, AnthropicToolResult, AnthropicThinking],
                            Field(discriminator="type")]


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[_AnthropicBlock]


class AnthropicTool(_Body):
    name: str
    description: str | None = None
    input_schema: dict


class AnthropicToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None                       # type "tool": the one to call
    disable_parallel_tool_use: bool | None = None


class AnthropicThinkingParam(_Body):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = Field(None, ge=0)


class CountTokensBody(_Body):
    """POST /v1/messages/count_tokens: what /v1/messages would prompt the model with."""
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[AnthropicText] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinkingParam | None = None


class MessagesBody(CountTokensBody):
    """POST /v1/messages (Anthropic's Messages API)."""
    max_tokens: int = Field(ge=1)
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    stream: bool | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: dict | None = None
    # the chat route's extensions
    lora: list[LoraRef] | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    logit_bias: dict | None = None
    grammar: str | None = None         # a GBNF (or Lark) grammar the output follows


# --------------------------------------------------------------------------- OpenAI Responses

class ResponsesContentPart(_Body):
    """A part of an input message's content: text parts are read, other kinds refused by name."""
    type: str
    text: str | None = None
    refusal: str | None = None


_ResponsesContent = str | list[ResponsesContentPart]


# Input items: the fields read; the rest (an item's id and status from an earlier response,
# encrypted reasoning) is ignored, as every body's unknown fields are.
class ResponsesMessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: _ResponsesContent


class ResponsesFunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class ResponsesFunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: _ResponsesContent


class ResponsesReasoningText(_Body):
    type: str
    text: str


class ResponsesReasoningItem(_Body):
    type: Literal["reasoning"]
    summary: list[ResponsesReasoningText] = []
    content: list[ResponsesReasoningText] | None = None


class ResponsesOtherItem(_Body):
    """An item kind this server does not take (an item_reference, a built-in tool's call):
    refused by name."""
    type: str


_RESPONSES_ITEMS = {"message": ResponsesMessageItem, "function_call": ResponsesFunctionCallItem,
                    "function_call_output": ResponsesFunctionCallOutputItem, "reasoning": ResponsesReasoningItem}


def _responses_item_kind(v: Any) -> str:
    """An input item's model, by its type (a message may leave it out): the class name is the
    union's tag, which an error's location leaves out as it does every request model's name."""
    kind = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", "message")
    return _RESPONSES_ITEMS.get(kind if isinstance(kind, str) else "", ResponsesOtherItem).__name__


ResponsesItem = Annotated[Union[tuple(Annotated[m, Tag(m.__name__)]
                                      for m in (*_RESPONSES_ITEMS.values(), ResponsesOtherItem))],
                          Discriminator(_responses_item_kind)]


class ResponsesTool(_Body):
    type: str                          # only "function" is served; others are refused by name
    name: str | None = None
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class ResponsesToolChoiceFunction(_Body):
    type: Literal["function"]
    name: str = Field(min_length=1)


class ResponsesTextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponsesTextConfig(_Body):
    format: ResponsesTextFormat | None = None
    verbosity: str | None = None


class ResponsesReasoningConfig(_Body):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: str | None = None


class ResponsesBody(_Body):
    """POST /v1/responses (OpenAI's Responses API, stateless)."""
    model: str | None = None
    input: Annotated[str, Field(min_length=1)] | Annotated[list[ResponsesItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    text: ResponsesTextConfig | None = None
    reasoning: ResponsesReasoningConfig | None = None
    previous_response_id: str | None = None      # a stored response this one continues
    conversation: Any = None                     # refused: conversations are not kept
    background: bool | None = None               # refused when true
    store: bool | None = None
    metadata: dict | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None             # refused: the output_text logprobs
    top_logprobs: int | None = Field(None, ge=0, le=20)   # refused above 0
    # the chat route's extensions
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = None
    ignore_eos: bool | None = None
    logit_bias: dict | None = None
    reasoning_budget: int | None = Field(None, ge=0)
    lora: list[LoraRef] | None = None


# --------------------------------------------------------------------------- Ollama

def _integral(v: Any) -> Any:
    """A whole float as an int: Ollama takes `"seed": 42.0` (Go reads JSON numbers as floats)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


_Int = Annotated[int, BeforeValidator(_integral, json_schema_input_type=int | float)]
# a string or a list of any length (Ollama's and llama-server's; OpenAI's holds to 4)
_AnyStops = Annotated[list[str] | None, BeforeValidator(_stop_list, json_schema_input_type=str | list[str] | None)]


class OllamaOptions(_Body):
    """An Ollama request's sampling `options`; Ollama's defaults where absent (ollama.py). Its
    load-time options (num_ctx, num_thread, num_gpu, use_mmap, ...) are the server's own
    settings: accepted, not acted on."""
    num_predict: _Int | None = Field(None, ge=-2)    # a bound; -1, -2 and 0: none (until the context is full)
    temperature: float | None = Field(None, ge=0.0)
    top_k: _Int | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0)
    repeat_last_n: _Int | None = Field(None, ge=-1)     # 0: off, -1: the whole context
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: _Int | None = None                             # negative: none
    stop: _AnyStops = None
    # samplers edgeinfer does not have: only their "off" values are taken
    mirostat: _Int | None = None
    typical_p: float | None = None
    tfs_z: float | None = None


class OllamaCalledFunction(_Body):
    name: str
    arguments: dict = Field(default_factory=dict)


class OllamaToolCall(_Body):
    function: OllamaCalledFunction


class OllamaMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None                  # an assistant's earlier thinking
    images: list[str] | None = None              # refused: the model reads text
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None                 # a tool result: the function that made it
    tool_call_id: str | None = None


class _OllamaGenBody(_Body):
    # null is the default wherever Ollama takes it (Go's zero values and nil pointers)
    model: str = Field(min_length=1)
    options: OllamaOptions | None = None
    format: Literal["", "json"] | dict | None = None   # JSON, or a JSON Schema the reply follows
    stream: bool | None = None                   # Ollama's default: streamed, one JSON object a line
    think: bool | Literal["low", "medium", "high"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    keep_alive: float | str | None = None        # models stay loaded: accepted; 0 with no input "unloads"


class OllamaChatBody(_OllamaGenBody):
    """POST /api/chat (Ollama's); no messages: Ollama's "load the model" request."""
    messages: list[OllamaMessage] | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None        # edgeinfer's extension: OpenAI's tool_choice
    truncate: bool | None = None                 # false: a conversation longer than the context is a 400


class OllamaGenerateBody(_OllamaGenBody):
    """POST /api/generate (Ollama's); no prompt: Ollama's "load the model" request."""
    prompt: str | None = None
    system: str | None = None
    raw: bool | None = None                      # the prompt as is, no chat template
    suffix: str | None = None                    # fill in the middle: the text after the gap
    template: str | None = None                  # refused: Go templates are not rendered
    context: list[int] | None = None             # refused: /api/chat carries a conversation
    images: list[str] | None = None              # refused: the model reads text


class OllamaEmbedBody(_Body):
    """POST /api/embed (Ollama's): unit-length vectors, one per input; no input: a load request."""
    model: str = Field(min_length=1)
    input: str | Annotated[list[str], Field(max_length=_MAX_EMBED_INPUTS)] | None = None
    truncate: bool | None = None                 # false: an input longer than the context is a 400
    dimensions: int | None = Field(None, ge=1)   # the first ones, made unit length again
    options: dict | None = None                  # load-time options: accepted, not acted on
    keep_alive: float | str | None = None


class OllamaEmbeddingsBody(_Body):
    """POST /api/embeddings (Ollama's older route): one vector; no prompt: a load request."""
    model: str = Field(min_length=1)
    prompt: str | None = None
    options: dict | None = None
    keep_alive: float | str | None = None


class OllamaShowBody(_Body):
    """POST /api/show (Ollama's)."""
    model: str = Field(min_length=1, validation_alias=AliasChoices("model", "name"))
    verbose: bool | None = None


# --------------------------------------------------------------------------- llama.cpp's own API

class InfillFile(_Body):
    """One file of /infill's `input_extra`: the project's context for the completion."""
    text: str
    filename: str = "tmp"


class LlamaCppBody(_Body):
    """POST /completion and /infill (llama-server's own API; its sampling defaults). Fields
    its clients send that change nothing here are accepted and type-checked: `cache_prompt`
    (prefixes are always reused), `id_slot`, `samplers`, `t_max_prompt_ms`,
    `timings_per_token`, `post_sampling_probs`, `n_keep`."""
    model_config = ConfigDict(json_schema_extra=lambda schema: schema["properties"]["prompt"].pop("default"))
    model: str | None = None
    prompt: Annotated[Any, WithJsonSchema(_ONE_PROMPT_SCHEMA)] = None   # /completion: required
    input_prefix: str | None = None                                 # /infill: required
    input_suffix: str | None = None                                 # /infill: required
    input_extra: list[InfillFile] | None = None
    n_predict: int | None = None          # negative: no bound; 0: the prompt only, into the cache
    max_tokens: int | None = None
    temperature: float | None = None      # <= 0: greedy
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0)
    repeat_last_n: int | None = Field(None, ge=-1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = None
    stop: _AnyStops = None
    ignore_eos: bool | None = None
    stream: bool | None = None
    n_probs: int | None = Field(None, ge=0, le=20)
    logit_bias: dict | list | None = None
    grammar: str | None = None
    json_schema: dict | None = None
    lora: list[LoraRef] | None = None
    return_tokens: bool | None = None
    response_fields: list[str] | None = None
    cache_prompt: bool | None = None
    id_slot: int | None = None
    samplers: list[str] | str | None = None
    n_indent: int | None = Field(None, ge=0)
    t_max_prompt_ms: int | None = None
    t_max_predict_ms: int | None = None
    timings_per_token: bool | None = None
    post_sampling_probs: bool | None = None
    n_keep: int | None = None


# the request models' class names (union members in an error's location)
_BODY_NAMES = frozenset(name for name, v in list(globals().items())
                        if isinstance(v, type) and issubclass(v, BaseModel))
