"""OpenAI-compatible HTTP server over the engine's continuous-batching scheduler."""
from .app import ServerState, create_app
from .runner import ServerThread, serve

__all__ = ["ServerState", "ServerThread", "create_app", "serve"]
