"""OpenAI's error body on the OpenAI-compatible routes: ``{"error": {"message", "type", "param", "code"}}``.

The routes raise tunebox's own errors (:class:`api.errors.ApiError`) and FastAPI's validation errors;
:class:`OpenAIRoute` turns both into the body and status the ``openai`` SDK reads. A planner refusal
is a 400 with ``code: "insufficient_gpu_memory"``: the SDK retries 409, 429 and 5xx, and a refusal
must not be sent again unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.errors import ApiError, PlanDoesNotFit, _from_validation

#: the paths the OpenAI-compatible routes live under (their errors use OpenAI's body)
OPENAI_PREFIXES = ("/v1/files", "/v1/fine_tuning")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}

#: tunebox's field paths -> the request parameter of the OpenAI-compatible body that set them
PARAMS = {
    "model.path": "model",
    "model": "model",
    "dataset.id": "training_file",
    "dataset": "training_file",
    "eval.dataset.id": "validation_file",
    "eval.dataset": "validation_file",
    "training.epochs": "hyperparameters.n_epochs",
    "training.learning_rate": "hyperparameters.learning_rate_multiplier",
    "training.micro_batch_size": "hyperparameters.batch_size",
    "training.seed": "seed",
    "name": "suffix",
}


class OpenAIError(ApiError):
    """An error raised by the OpenAI-compatible routes themselves, with OpenAI's ``code``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, headers=headers)
        self.status_code, self.param, self.code = status, param, code


def _param(error: ApiError) -> str | None:
    if isinstance(error, OpenAIError):
        return error.param
    if not error.errors:
        return None
    field = str(error.errors[0].get("field", ""))
    if field.startswith("tunebox.") or field in ("body", ""):
        return field or None
    return PARAMS.get(field, f"tunebox.{field}")


def _message(error: ApiError) -> str:
    if isinstance(error, PlanDoesNotFit):
        fixes = error.extensions.get("alternatives") or []
        if fixes:
            cheapest = fixes[0]
            return (
                f"{error.detail.split('. What fits')[0]}. Cheapest fix: {cheapest.get('changes')} "
                f"({cheapest.get('reason')})"
            )
    return error.detail


def error_body(error: ApiError) -> tuple[int, dict[str, Any]]:
    """The status and ``{"error": ...}`` body of ``error``."""
    status = error.status_code if isinstance(error, OpenAIError) else error.status
    code = error.code if isinstance(error, OpenAIError) else error.slug.replace("-", "_")
    if isinstance(error, PlanDoesNotFit):
        status, code = 400, "insufficient_gpu_memory"
    elif status == 422 or (status == 409 and "Retry-After" not in error.headers):
        # OpenAI answers invalid requests with 400; the SDK retries a 409, which only a request still
        # in flight (it says when to retry) should get
        status = 400
    body = {
        "message": _message(error),
        "type": _TYPES.get(status, "invalid_request_error"),
        "param": _param(error),
        "code": code,
    }
    return status, {"error": body}


def openai_response(error: ApiError) -> JSONResponse:
    status, body = error_body(error)
    return JSONResponse(body, status_code=status, headers=error.headers)


class OpenAIRoute(APIRoute):
    """A route whose errors (its own, its dependencies' and its body's validation) use OpenAI's body."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                return openai_response(exc)
            except StarletteHTTPException as exc:  # FastAPI's own, e.g. a body it cannot parse
                detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
                return openai_response(OpenAIError(exc.status_code, detail, headers=exc.headers))
            except RequestValidationError as exc:
                # the body's own fields: their paths are the request's parameters already
                converted = _from_validation(exc)
                field = converted.errors[0]["field"] if converted.errors else None
                return openai_response(
                    OpenAIError(400, converted.detail, param=field, code=converted.slug.replace("-", "_"))
                )

        return route
