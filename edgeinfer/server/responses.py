"""The server's response bodies as pydantic models: the contract GET /openapi.json publishes
(server/openapi.py builds the document from them and from the request models of protocol.py).
The handlers answer plain JSON; tests/test_openapi.py checks every answer against these."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, RootModel

__all__ = ["ErrorResponse", "Health", "ModelObject", "ModelList", "Tokens", "Detokenized",
           "ChatCompletion", "ChatCompletionChunk", "Completion", "CompletionChunk",
           "AnthropicErrorResponse", "AnthropicMessageOut", "AnthropicStreamEvent", "InputTokens",
           "EmbeddingList", "ResponseObject", "ResponseStreamEvent", "ResponseDeleted"]

FinishReason = Literal["stop", "length", "tool_calls", "cancelled"]


class _Out(BaseModel):
    # OpenAI adds fields over time: clients must ignore the ones they do not know
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Out):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Out):
    """Every error, and an error event inside a stream: OpenAI's shape."""
    error: ErrorDetail


class SlotCounts(_Out):
    slots_busy: int
    slots_total: int
    queue_length: int


class Health(_Out):
    """/health and /ready: "ok" with the slot counts (per model when there are several), or
    loading / draining / failed with the error."""
    status: Literal["ok", "loading", "draining", "failed"]
    error: str | None = None
    slots_busy: int | None = None
    slots_total: int | None = None
    queue_length: int | None = None
    models: dict[str, SlotCounts] | None = None


class ModelMeta(_Out):
    n_ctx: int
    n_slots: int
    n_vocab: int
    arch: str
    parent: str | None = None        # a LoRA adapter: the served model it runs on
    lora_id: int | None = None       # a LoRA adapter: its id (a request's `lora` may name it)


class LoraAdapter(_Out):
    """A loaded LoRA adapter (GET /v1/lora-adapters; POST answers the one it loaded)."""
    id: int
    name: str
    path: str
    model: str                       # the served model it runs on
    ranks: list[int]
    tensors: int
    bytes: int


class LoraAdapterList(_Out):
    object: Literal["list"]
    data: list[LoraAdapter]


class LlamaLoraAdapter(_Out):
    """llama.cpp's GET /lora-adapters entry; scale 0: applied only to requests that ask for it."""
    id: int
    path: str
    scale: float


class LlamaLoraAdapterList(RootModel[list[LlamaLoraAdapter]]):
    """llama.cpp's GET /lora-adapters answer: a bare list."""


class Deleted(_Out):
    id: str
    object: Literal["lora_adapter"]
    deleted: bool


class ModelObject(_Out):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    meta: ModelMeta


class ModelList(_Out):
    object: Literal["list"]
    data: list[ModelObject]


class TokenPiece(_Out):
    id: int
    piece: str


class Tokens(_Out):
    """/tokenize: the ids, or with `with_pieces` each id with its text; their count and the
    context (vLLM's fields)."""
    tokens: list[int] | list[TokenPiece]
    count: int
    max_model_len: int


class Detokenized(_Out):
    content: str
    prompt: str                     # the same text under vLLM's key


class TokenizerInfo(_Out):
    """GET /tokenizer_info (vLLM's route)."""
    tokenizer_class: str
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None
    add_bos_token: bool
    add_eos_token: bool
    model_max_length: int
    chat_template: str | None


class SlotAction(_Out):
    """POST /slots/{id_slot} (llama.cpp's shape): what the action saved, restored or erased."""
    id_slot: int
    filename: str | None = None
    n_saved: int | None = None
    n_written: int | None = None
    n_restored: int | None = None
    n_read: int | None = None
    n_erased: int | None = None
    timings: dict[str, float] = {}


class EmbeddingUsage(_Out):
    prompt_tokens: int
    total_tokens: int


class Embedding(_Out):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str     # base64: little-endian float32


class EmbeddingList(_Out):
    """POST /v1/embeddings: one vector per input, in input order."""
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class RankedDocument(_Out):
    text: str


class RankResult(_Out):
    index: int                        # the document's place in the request
    relevance_score: float
    document: RankedDocument | None = None      # only with return_documents


class RankList(_Out):
    """POST /rerank (Jina's, Cohere's and llama-server's reply): the results by falling relevance."""
    id: str
    object: Literal["list"]
    model: str
    results: list[RankResult]
    usage: EmbeddingUsage


class TeiRank(_Out):
    index: int
    score: float
    text: str | None = None           # only with return_text


class RerankReply(RootModel[RankList | list[TeiRank]]):
    """The reply to `documents` (RankList), or to TEI's `texts` (a bare list by falling score)."""


class PromptTokensDetails(_Out):
    cached_tokens: int


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CalledFunctionOut(_Out):
    name: str
    arguments: str


class ToolCallOut(_Out):
    id: str
    type: Literal["function"]
    function: CalledFunctionOut


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[ChatTokenLogprob]
    refusal: None


class AssistantMessage(_Out):
    role: Literal["assistant"]
    content: str | None
    refusal: None
    tool_calls: list[ToolCallOut] | None = None
    reasoning_content: str | None = None     # templates with a thinking block: its text


class ChatChoice(_Out):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class _Reply(_Out):
    id: str
    created: int
    model: str
    system_fingerprint: str


class ChatCompletion(_Reply):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage


class CompletionLogprobs(_Out):
    """An echoed prompt's first token has null for its logprob and alternatives (OpenAI's)."""
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason


class Completion(_Reply):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage


class ToolCallDelta(_Out):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str] | None = None


class ChatDelta(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None


class ChatChunkChoice(_Out):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(_Reply):
    """One event of a streamed chat completion; with include_usage, `usage` is null but in
    the last event, which has no choices."""
    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunkChoice(_Out):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(_Reply):
    object: Literal["text_completion"]
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


# --------------------------------------------------------------------------- Anthropic Messages

class AnthropicErrorDetail(_Out):
    type: str
    message: str


class AnthropicErrorResponse(_Out):
    """Every error of the /v1/messages routes, and an error event in their streams: Anthropic's shape."""
    type: Literal["error"]
    error: AnthropicErrorDetail


class AnthropicUsage(_Out):
    input_tokens: int
    output_tokens: int


class TextBlockOut(_Out):
    type: Literal["text"]
    text: str


class ThinkingBlockOut(_Out):
    type: Literal["thinking"]
    thinking: str
    signature: str


class ToolUseBlockOut(_Out):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


ContentBlockOut = Annotated[Union[TextBlockOut, ThinkingBlockOut, ToolUseBlockOut], Field(discriminator="type")]
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal", "pause_turn"]


class AnthropicMessageOut(_Out):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlockOut]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: AnthropicUsage


class InputTokens(_Out):
    """POST /v1/messages/count_tokens."""
    input_tokens: int


class MessageStart(_Out):
    type: Literal["message_start"]
    message: AnthropicMessageOut


class ContentBlockStart(_Out):
    type: Literal["content_block_start"]
    index: int
    content_block: ContentBlockOut


class TextDelta(_Out):
    type: Literal["text_delta"]
    text: str


class ThinkingDelta(_Out):
    type: Literal["thinking_delta"]
    thinking: str


class InputJsonDelta(_Out):
    type: Literal["input_json_delta"]
    partial_json: str


class ContentBlockDelta(_Out):
    type: Literal["content_block_delta"]
    index: int
    delta: Annotated[Union[TextDelta, ThinkingDelta, InputJsonDelta], Field(discriminator="type")]


class ContentBlockStop(_Out):
    type: Literal["content_block_stop"]
    index: int


class MessageDeltaBody(_Out):
    stop_reason: StopReason | None
    stop_sequence: str | None


class OutputUsage(_Out):
    output_tokens: int


class MessageDelta(_Out):
    type: Literal["message_delta"]
    delta: MessageDeltaBody
    usage: OutputUsage


class MessageStop(_Out):
    type: Literal["message_stop"]


class Ping(_Out):
    type: Literal["ping"]


class AnthropicStreamEvent(RootModel):
    """One event of a streamed /v1/messages reply (its SSE `event:` field names the type)."""
    root: Annotated[Union[MessageStart, ContentBlockStart, ContentBlockDelta, ContentBlockStop, MessageDelta,
                          MessageStop, Ping, AnthropicErrorResponse], Field(discriminator="type")]


# --------------------------------------------------------------------------- OpenAI Responses

class OutputText(_Out):
    type: Literal["output_text"]
    text: str
    annotations: list
    logprobs: list


class ReasoningText(_Out):
    type: Literal["reasoning_text"]
    text: str


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessageItem(_Out):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    status: ItemStatus
    content: list[OutputText]


class ReasoningItem(_Out):
    id: str
    type: Literal["reasoning"]
    status: ItemStatus
    summary: list
    content: list[ReasoningText]


class FunctionCallItem(_Out):
    id: str
    type: Literal["function_call"]
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


OutputItem = Annotated[Union[OutputMessageItem, ReasoningItem, FunctionCallItem], Field(discriminator="type")]


class ResponseDeleted(_Out):
    """DELETE /v1/responses/{response_id}."""
    id: str
    object: Literal["response"]
    deleted: bool


class ResponsesInputDetails(_Out):
    cached_tokens: int


class ResponsesOutputDetails(_Out):
    reasoning_tokens: int


class ResponsesUsage(_Out):
    input_tokens: int
    input_tokens_details: ResponsesInputDetails
    output_tokens: int
    output_tokens_details: ResponsesOutputDetails
    total_tokens: int


class IncompleteDetails(_Out):
    reason: Literal["max_output_tokens"]


class ResponseObject(_Out):
    """POST /v1/responses and GET /v1/responses/{response_id}: a Response."""
    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None
    status: Literal["in_progress", "completed", "incomplete"]
    error: None
    incomplete_details: IncompleteDetails | None
    model: str
    output: list[OutputItem]
    instructions: str | None
    max_output_tokens: int | None
    metadata: dict
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict
    store: bool
    temperature: float
    text: dict
    tool_choice: str | dict
    tools: list[dict]
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponsesUsage | None
    user: str | None


class _Numbered(_Out):
    sequence_number: int


class ResponseLifecycleEvent(_Numbered):
    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete"]
    response: ResponseObject


class OutputItemEvent(_Numbered):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(_Numbered):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: Annotated[Union[OutputText, ReasoningText], Field(discriminator="type")]


class TextDeltaEvent(_Numbered):
    type: Literal["response.output_text.delta", "response.reasoning_text.delta"]
    item_id: str
    output_index: int
    content_index: int
    delta: str


class TextDoneEvent(_Numbered):
    type: Literal["response.output_text.done", "response.reasoning_text.done"]
    item_id: str
    output_index: int
    content_index: int
    text: str


class ArgumentsDeltaEvent(_Numbered):
    type: Literal["response.function_call_arguments.delta"]
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(_Numbered):
    type: Literal["response.function_call_arguments.done"]
    item_id: str
    output_index: int
    arguments: str


class ResponseErrorEvent(_Numbered):
    type: Literal["error"]
    message: str
    code: str | None
    param: str | None


class ResponseStreamEvent(RootModel):
    """One event of a streamed /v1/responses reply (its SSE `event:` field names the type)."""
    root: Union[ResponseLifecycleEvent, OutputItemEvent, ContentPartEvent, TextDeltaEvent, TextDoneEvent,
                ArgumentsDeltaEvent, ArgumentsDoneEvent, ResponseErrorEvent]


# --------------------------------------------------------------------------- Ollama

class OllamaErrorResponse(_Out):
    """Every error of the /api routes, and an error line in their streams: Ollama's shape."""
    error: str


class OllamaFunction(_Out):
    index: int
    name: str
    arguments: dict


class OllamaToolCallOut(_Out):
    function: OllamaFunction


class OllamaMessageOut(_Out):
    role: Literal["assistant"]
    content: str
    thinking: str | None = None
    tool_calls: list[OllamaToolCallOut] | None = None


class OllamaLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class _OllamaReply(_Out):
    """One object of a reply: a line of a stream (done false), or its last object (done true,
    with the timings in nanoseconds), which is the whole reply when not streamed."""
    model: str
    created_at: str
    done: bool
    done_reason: Literal["stop", "length", "load", "unload"] | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    logprobs: list[OllamaLogprob] | None = None


class OllamaChatReply(_OllamaReply):
    message: OllamaMessageOut


class OllamaGenerateReply(_OllamaReply):
    response: str
    thinking: str | None = None


class OllamaEmbedReply(_Out):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class OllamaEmbedding(_Out):
    embedding: list[float]          # empty for a load request (no prompt)


class OllamaDetails(_Out):
    parent_model: str
    format: Literal["gguf"]
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


class OllamaModel(_Out):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: OllamaDetails


class OllamaModelList(_Out):
    models: list[OllamaModel]


class OllamaRunningModel(OllamaModel):
    expires_at: str
    size_vram: int
    context_length: int


class OllamaRunningList(_Out):
    models: list[OllamaRunningModel]


class OllamaShowReply(_Out):
    license: str
    modelfile: str
    parameters: str
    template: str
    details: OllamaDetails
    model_info: dict
    capabilities: list[Literal["completion", "tools", "thinking"]]
    modified_at: str


class OllamaVersion(_Out):
    version: str        # the Ollama release whose API the routes follow
    edgeinfer: str


# --------------------------------------------------------------------------- llama-server's own API

class LlamaTimings(_Out):
    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float


class LlamaTokenProb(_Out):
    id: int
    token: str
    bytes: list[int]
    logprob: float


class LlamaCompletionProb(LlamaTokenProb):
    top_logprobs: list[LlamaTokenProb]


class LlamaCompletion(_Out):
    """POST /completion and /infill: the reply, and each event of its stream (`stop` false with
    a piece of `content`; the last `stop` true with empty content and the rest). Every field is
    there unless the request's `response_fields` picked some (then under their paths)."""
    index: int | None = None
    content: str | None = None
    tokens: list[int] | None = None
    id_slot: int | None = None
    stop: bool | None = None
    model: str | None = None
    tokens_predicted: int | None = None
    tokens_evaluated: int | None = None
    generation_settings: dict | None = None
    prompt: str | None = None
    has_new_line: bool | None = None
    truncated: bool | None = None
    stop_type: Literal["none", "eos", "limit", "word"] | None = None
    stopping_word: str | None = None
    tokens_cached: int | None = None
    timings: LlamaTimings | None = None
    completion_probabilities: list[LlamaCompletionProb] | None = None
