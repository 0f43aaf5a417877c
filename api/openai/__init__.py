"""OpenAI-compatible routes: ``/v1/files`` and ``/v1/fine_tuning/jobs``, so the official ``openai`` SDK
works against tunebox with only ``base_url`` changed (and a tunebox token as the API key)."""

from api.openai.files import router as files_router
from api.openai.jobs import router as fine_tuning_router

__all__ = ["files_router", "fine_tuning_router"]
