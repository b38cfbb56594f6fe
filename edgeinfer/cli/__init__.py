"""The `edgeinfer` command: one typer app, one module per command group.

main: run, chat, info, pull, models · convert: convert, eval · deploy: doctor, plan ·
serve: serve · bench: bench.
"""
from . import bench, convert, deploy, serve
from .main import app

for _group in (convert, deploy, serve, bench):
    _group.register(app)

__all__ = ["app"]
