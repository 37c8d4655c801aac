"""ingot's OpenAI-compatible HTTP server (FastAPI + uvicorn) over the runtime's Generator:
`ingot serve out/demo --port 8000` runs `run_server`.

Imports the rest of ingot.runtime (and through it ingot.artifacts, ingot.common), fastapi,
uvicorn, prometheus_client and pydantic; nothing else in the runtime imports it.
"""

from ingot.runtime.server.app import create_app
from ingot.runtime.server.async_llm import AsyncLLM
from ingot.runtime.server.launch import load_served_model, run_server
from ingot.runtime.server.metrics import Metrics
from ingot.runtime.server.stream import ServedModel

__all__ = ["AsyncLLM", "Metrics", "ServedModel", "create_app", "load_served_model", "run_server"]
