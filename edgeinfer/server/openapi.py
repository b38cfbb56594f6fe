"""The OpenAPI 3.1 document of the HTTP API (GET /openapi.json), generated from the pydantic
request models (protocol.py) and response models (responses.py): the routes are listed once,
in OPERATIONS, and create_app registers exactly those."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import version

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from . import responses as R
from .protocol import (ChatBody, CompletionBody, CountTokensBody, DetokenizeBody, EmbeddingsBody, LlamaCppBody,
                       LoraLoadBody, MessagesBody, OllamaChatBody, OllamaEmbedBody, OllamaEmbeddingsBody, OllamaGenerateBody,
                       OllamaShowBody, RerankBody, ResponsesBody, SlotBody, TokenizeBody)

__all__ = ["Operation", "OPERATIONS", "document"]

# The errors every route may answer (the middleware's: auth is added when a key is set)
COMMON_ERRORS = {"404": "no such route", "405": "method not allowed on this route"}
GENERATION_ERRORS = {"400": "a bad field, named in `param`; a prompt that does not fit the context",
                     "404": "`model` names no served model (code model_not_found)",
                     "413": "the body exceeds the server's limit",
                     "429": "the model's queue is full (Retry-After)",
                     "503": "loading, failed or shutting down (Retry-After)"}
OLLAMA_GENERATION_ERRORS = {"400": "a bad field, named in the message; a prompt that does not fit the context",
                            "404": "`model` names no served model", "413": "the body exceeds the server's limit",
                            "429": "the model's queue is full (Retry-After)",
                            "503": "loading, failed or shutting down (Retry-After)"}
OLLAMA_EMBED_ERRORS = {k: v for k, v in {**OLLAMA_GENERATION_ERRORS, "501": "a backend without embeddings"}.items()
                       if k != "429"}
STREAM = "text/event-stream"
NDJSON = "application/x-ndjson"
_RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}


@dataclass(frozen=True)
class Operation:
    """One route: its handler's name in app.py, what it takes and what it answers."""
    method: str
    path: str
    handler: str
    summary: str
    body: type[BaseModel] | None = None
    ok: type[BaseModel] | None = None           # the 200 JSON body
    ok_text: tuple[str, ...] = ()               # or 200 media types of plain text
    stream: type[BaseModel] | None = None       # the events of a 200 text/event-stream reply
    errors: dict[str, str] = field(default_factory=dict)
    public: bool = False                        # answered without the API key
    dialect: str = "openai"                     # whose error and stream shapes: "anthropic", "ollama"
    named_events: bool = False                  # stream events name their type in `event`, no [DONE]
    params: tuple[dict, ...] = ()               # path and query parameters beyond {model_id}
    operation_id: str = ""                      # where one handler serves several paths; else the handler's name

    @property
    def error_model(self) -> type[BaseModel]:
        return {"openai": R.ErrorResponse, "anthropic": R.AnthropicErrorResponse,
                "ollama": R.OllamaErrorResponse}[self.dialect]


OPERATIONS = (
    Operation("GET", "/health", "health", "Liveness: 200 unless an engine failed", ok=R.Health,
              errors={"503": "an engine failed: restart"}, public=True),
    Operation("GET", "/ready", "ready", "Readiness: 200 when every model is loaded and serving", ok=R.Health,
              errors={"503": "loading, draining or failed"}, public=True),
    Operation("GET", "/v1/models", "models", "The loaded models, the default first", ok=R.ModelList),
    Operation("GET", "/v1/models/{model_id}", "model", "A served model under any of its names", ok=R.ModelObject,
              errors={"404": "no served model of that name", "503": "loading, failed or shutting down"}),
    Operation("GET", "/metrics", "metrics", "Prometheus metrics (OpenMetrics when the Accept header asks)",
              ok_text=("text/plain", "application/openmetrics-text")),
    Operation("GET", "/openapi.json", "openapi", "This document", ok_text=("application/json",), public=True),
    Operation("POST", "/v1/chat/completions", "chat_completions", "OpenAI chat completions", body=ChatBody,
              ok=R.ChatCompletion, stream=R.ChatCompletionChunk, errors=GENERATION_ERRORS),
    Operation("POST", "/v1/completions", "completions", "OpenAI text completions", body=CompletionBody,
              ok=R.Completion, stream=R.CompletionChunk, errors=GENERATION_ERRORS),
    Operation("POST", "/v1/embeddings", "embeddings", "OpenAI embeddings (pooled as the model file says, "
              "else mean; unit length)", body=EmbeddingsBody, ok=R.EmbeddingList,
              errors={**{k: v for k, v in GENERATION_ERRORS.items() if k != "429"},
                      "400": "a bad field, named in `param`: an empty input, one longer than the context, "
                             "`dimensions` other than the model's",
                      "501": "the backend gives no embeddings"}),
    *(Operation("POST", path, "rerank", "Reranking: the documents by relevance to the query (Jina's, Cohere's and "
                "llama-server's fields; Hugging Face TEI's with `texts`) on a reranker model", body=RerankBody,
                ok=R.RerankReply, errors={**{k: v for k, v in GENERATION_ERRORS.items() if k != "429"},
                                          "400": "a bad field, named in `param`: no documents, a document whose "
                                                 "prompt does not fit the context, a model that is not a reranker",
                                          "501": "the backend gives no hidden states (CUDA)"},
                operation_id=path.strip("/").replace("/", "_"))
      for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/v2/rerank")),
    Operation("POST", "/tokenize", "tokenize", "Text to token ids (the default model)", body=TokenizeBody,
              ok=R.Tokens, errors={"400": "a bad field", "413": "the body exceeds the server's limit",
                                   "503": "loading, failed or shutting down"}),
    Operation("POST", "/detokenize", "detokenize", "Token ids to text (the default model)", body=DetokenizeBody,
              ok=R.Detokenized, errors={"400": "a bad field or a token id outside the vocabulary",
                                        "413": "the body exceeds the server's limit",
                                        "503": "loading, failed or shutting down"}),
    Operation("GET", "/tokenizer_info", "tokenizer_info", "The default model's special tokens and chat template "
              "(vLLM's route, for lm-evaluation-harness's remote tokenizer)", ok=R.TokenizerInfo,
              errors={"503": "loading, failed or shutting down"}),
    Operation("POST", "/v1/responses", "create_response", "OpenAI Responses (kept in memory for "
              "previous_response_id unless store is false)", body=ResponsesBody, ok=R.ResponseObject,
              stream=R.ResponseStreamEvent, errors=GENERATION_ERRORS, named_events=True),
    Operation("GET", "/v1/responses/{response_id}", "get_response", "A kept Response", ok=R.ResponseObject,
              params=(_RESPONSE_ID,), errors={"404": "no kept response of that id"}),
    Operation("DELETE", "/v1/responses/{response_id}", "delete_response", "Forgets a kept Response",
              ok=R.ResponseDeleted, params=(_RESPONSE_ID,), errors={"404": "no kept response of that id"}),
    Operation("POST", "/v1/messages", "messages", "Anthropic Messages", body=MessagesBody,
              ok=R.AnthropicMessageOut, stream=R.AnthropicStreamEvent, errors=GENERATION_ERRORS, dialect="anthropic",
              named_events=True),
    Operation("POST", "/v1/messages/count_tokens", "count_tokens", "Anthropic token count of a Messages request",
              body=CountTokensBody, ok=R.InputTokens, dialect="anthropic",
              errors={k: v for k, v in GENERATION_ERRORS.items() if k != "429"}),
    Operation("POST", "/slots/{id_slot}", "slot_action",
              "llama.cpp's slot save / restore (a file inside --prompt-cache DIR) / erase", body=SlotBody,
              ok=R.SlotAction,
              params=({"name": "id_slot", "in": "path", "required": True, "schema": {"type": "integer"}},
                      {"name": "action", "in": "query", "required": True,
                       "schema": {"enum": ["save", "restore", "erase"]}}),
              errors={"400": "a bad action, slot id or filename (a path, '..'), or a file that is missing, "
                             "corrupt, truncated or from another model",
                      "409": "the slot is busy", "413": "the body exceeds the server's limit",
                      "501": "no --prompt-cache directory, or a runtime that cannot save a slot",
                      "503": "loading, failed or shutting down"}),
    Operation("GET", "/v1/lora-adapters", "lora_list", "The loaded LoRA adapters (of the default model)",
              ok=R.LoraAdapterList, errors={"503": "loading, failed or shutting down"}),
    Operation("POST", "/v1/lora-adapters", "lora_load", "Loads a LoRA adapter from inside --lora-dir DIR",
              body=LoraLoadBody, ok=R.LoraAdapter,
              errors={"400": "a bad name or path (absolute, '..', outside the directory), a name in use, or an "
                             "adapter that does not fit the model (the message names the tensor) or the budget",
                      "413": "the body exceeds the server's limit", "501": "no --lora-dir, or a runtime "
                      "without adapters", "503": "loading, failed or shutting down"}),
    Operation("DELETE", "/v1/lora-adapters/{name}", "lora_unload", "Unloads a LoRA adapter", ok=R.Deleted,
              params=({"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},),
              errors={"404": "no adapter of that name", "409": "requests are using it",
                      "503": "loading, failed or shutting down"}),
    Operation("GET", "/lora-adapters", "lora_llama", "llama.cpp's adapter list (id, path, scale)",
              ok=R.LlamaLoraAdapterList, errors={"503": "loading, failed or shutting down"}),
    Operation("POST", "/completion", "llama_completion", "llama-server's completion (its fields, defaults and reply)",
              body=LlamaCppBody, ok=R.LlamaCompletion, stream=R.LlamaCompletion, errors=GENERATION_ERRORS),
    Operation("POST", "/infill", "llama_infill", "llama-server's fill in the middle: code between a prefix and a "
              "suffix, with the project's files as context", body=LlamaCppBody, ok=R.LlamaCompletion,
              stream=R.LlamaCompletion, errors={**GENERATION_ERRORS, "501": "the model has no fill-in-the-middle "
                                                "tokens (llama-server's not_supported_error)"}),
    Operation("POST", "/api/chat", "ollama_chat", "Ollama chat (streamed unless `stream` is false)",
              body=OllamaChatBody, ok=R.OllamaChatReply, stream=R.OllamaChatReply, errors=OLLAMA_GENERATION_ERRORS,
              dialect="ollama"),
    Operation("POST", "/api/generate", "ollama_generate", "Ollama generation (streamed unless `stream` is false)",
              body=OllamaGenerateBody, ok=R.OllamaGenerateReply, stream=R.OllamaGenerateReply,
              errors=OLLAMA_GENERATION_ERRORS, dialect="ollama"),
    Operation("POST", "/api/embed", "ollama_embed", "Ollama embeddings (unit length), one per input",
              body=OllamaEmbedBody, ok=R.OllamaEmbedReply, dialect="ollama", errors=OLLAMA_EMBED_ERRORS),
    Operation("POST", "/api/embeddings", "ollama_embeddings", "Ollama's older embedding route: one vector",
              body=OllamaEmbeddingsBody, ok=R.OllamaEmbedding, dialect="ollama", errors=OLLAMA_EMBED_ERRORS),
    Operation("GET", "/api/tags", "ollama_tags", "Ollama's list of the served models", ok=R.OllamaModelList,
              dialect="ollama"),
    Operation("POST", "/api/show", "ollama_show", "Ollama's model details, metadata, template and capabilities",
              body=OllamaShowBody, ok=R.OllamaShowReply, dialect="ollama",
              errors={"400": "a bad field", "404": "`model` names no served model",
                      "413": "the body exceeds the server's limit", "503": "loading, failed or shutting down"}),
    Operation("GET", "/api/ps", "ollama_ps", "Ollama's list of the loaded models and their memory",
              ok=R.OllamaRunningList, dialect="ollama"),
    Operation("GET", "/", "ollama_root", "Says the server runs, in the words Ollama's front ends look for",
              ok_text=("text/plain",), public=True, dialect="ollama"),
    Operation("GET", "/api/version", "ollama_version", "The server's version (Ollama's route)", ok=R.OllamaVersion,
              dialect="ollama"),
)

_REF = "#/components/schemas/{model}"


def _ref(model: type[BaseModel]) -> dict:
    return {"$ref": _REF.format(model=model.__name__)}


def _event(op: Operation) -> dict:
    """One server-sent event: a JSON chunk, an error object, or (OpenAI's chat and completions)
    the closing [DONE]; Anthropic's and the Responses API's events name their type in `event`."""
    json_data = {"contentMediaType": "application/json",
                 "contentSchema": {"anyOf": [_ref(op.stream), _ref(op.error_model)]}}
    if op.named_events:
        return {"type": "object", "required": ["event", "data"],
                "properties": {"event": {"type": "string"}, "data": {"type": "string", **json_data}}}
    return {"type": "object", "required": ["data"],
            "properties": {"data": {"type": "string", "anyOf": [{"const": "[DONE]"}, json_data]}}}


_STREAMED = (" (streamed when `stream` is true)", " (streamed unless `stream` is false)")


def _operation(op: Operation, auth: bool) -> dict:
    ok: dict = {}
    if op.ok is not None:
        ok["application/json"] = {"schema": _ref(op.ok)}
    for media in op.ok_text:
        ok[media] = {"schema": {"type": "object"} if media == "application/json" else {"type": "string"}}
    if op.stream is not None and op.dialect == "ollama":    # a JSON object a line
        ok[NDJSON] = {"schema": {"anyOf": [_ref(op.stream), _ref(op.error_model)]}}
    elif op.stream is not None:
        ok[STREAM] = {"schema": _event(op)}
    error = {"application/json": {"schema": _ref(op.error_model)}}
    errors = {**COMMON_ERRORS, **op.errors}
    if auth and not op.public:
        errors["401"] = "a missing or wrong API key"
    out: dict = {"operationId": op.operation_id or op.handler, "summary": op.summary,
                 "responses": {"200": {"description": "OK" + (_STREAMED[op.dialect == "ollama"] if op.stream else ""),
                                       "content": ok},
                               **{code: {"description": why, "content": error} for code, why in sorted(errors.items())}}}
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(op.body)}}}
    if "{model_id}" in op.path:
        out["parameters"] = [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    if op.params:
        out["parameters"] = [*out.get("parameters", ()), *op.params]
    if auth:
        out["security"] = [] if op.public else [{"apiKey": []}]
    return out


@cache
def _schemas() -> dict:
    models = [op.body for op in OPERATIONS if op.body] + [m for op in OPERATIONS for m in (op.ok, op.stream) if m]
    models += [R.ErrorResponse, R.AnthropicErrorResponse, R.OllamaErrorResponse]
    _, defs = models_json_schema([(m, "validation") for m in dict.fromkeys(models)], ref_template=_REF)
    return defs["$defs"]


def document(auth: bool = False) -> dict:
    """The document; `auth`: the server asks for an API key (Authorization: Bearer)."""
    paths: dict = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, auth)
    doc = {"openapi": "3.1.0",
           "info": {"title": "edgeinfer", "version": version("edgeinfer"),
                    "description": "The HTTP API of `edgeinfer serve`: OpenAI's, Anthropic's Messages and "
                                   "Ollama's."},
           "paths": paths, "components": {"schemas": _schemas()}}
    if auth:
        doc["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
    return doc
