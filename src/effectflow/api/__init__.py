"""The HTTP API: runs, timelines, effects, the attention queue and people's decisions, over the
runtime's public methods (``create_app``); ``effectflow serve`` runs it under uvicorn."""

from effectflow.api.app import create_app

__all__ = ["create_app"]
