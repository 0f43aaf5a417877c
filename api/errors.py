"""One error base and its RFC 9457 problem+json body.

Every error the API returns, its own or FastAPI's and Starlette's (validation, unknown route,
wrong method, malformed JSON, oversized body), has the same shape::

    {"type": "https://tunebox.dev/problems/<slug>", "title": ..., "status": ..., "detail": ...,
     "instance": "<request path>", "errors": [{"field": "training.seq_len", "message": ...}]}
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_BASE = "https://tunebox.dev/problems/"


class FieldError(dict[str, Any]):
    """``{"field": dotted path, "message": text}`` plus optional keys such as ``row``."""

    def __init__(self, field: str, message: str, **extra: Any) -> None:
        super().__init__(field=field, message=message, **extra)


class ApiError(Exception):
    """Base of every error the API raises on purpose; the handler turns it into problem+json."""

    status: ClassVar[int] = 400
    slug: ClassVar[str] = "bad-request"
    title: ClassVar[str] = "Bad request"

    def __init__(
        self,
        detail: str,
        *,
        errors: Sequence[Mapping[str, Any]] = (),
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = [dict(e) for e in errors]
        self.headers = dict(headers or {})
        self.extensions = extensions

    @classmethod
    def for_field(cls, field: str, message: str, **kwargs: Any) -> ApiError:
        return cls(f"{field}: {message}", errors=[FieldError(field, message)], **kwargs)


class InvalidInput(ApiError):
    status, slug, title = 422, "invalid-input", "Invalid input"


class MalformedBody(ApiError):
    status, slug, title = 400, "malformed-body", "Malformed request body"


class Unauthorized(ApiError):
    status, slug, title = 401, "unauthorized", "Authentication required"


class Forbidden(ApiError):
    status, slug, title = 403, "forbidden", "Not allowed"


class NotFound(ApiError):
    status, slug, title = 404, "not-found", "Not found"


class Conflict(ApiError):
    status, slug, title = 409, "conflict", "Conflict"


class BodyTooLarge(ApiError):
    status, slug, title = 413, "body-too-large", "Request body too large"


class UnsupportedMediaType(ApiError):
    status, slug, title = 415, "unsupported-media-type", "Unsupported media type"


class TooManyRequests(ApiError):
    status, slug, title = 429, "too-many-requests", "Too many requests"


class ServiceUnavailable(ApiError):
    status, slug, title = 503, "unavailable", "Service unavailable"


class PlanDoesNotFit(InvalidInput):
    slug, title = "plan-does-not-fit", "The job does not fit this box"


class GpusExceedBox(InvalidInput):
    slug, title = "num-gpus-exceeds-box", "More GPUs asked than the box has"


class SeqLenBeyondContext(InvalidInput):
    slug, title = "seq-len-beyond-context", "seq_len exceeds the model's trained context"


class MethodUnavailable(InvalidInput):
    slug, title = "method-unavailable", "The box cannot run this method"


#: a planner refusal's code -> its problem type (any other code is plain invalid input)
PLAN_REFUSALS: dict[str, type[InvalidInput]] = {
    "num_gpus_exceeds_box": GpusExceedBox,
    "seq_len_beyond_context": SeqLenBeyondContext,
    "method_unavailable": MethodUnavailable,
}


def problem_body(
    *, status: int, slug: str, title: str, detail: str, instance: str,
    errors: Sequence[Mapping[str, Any]] = (), extensions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"type": PROBLEM_BASE + slug, "title": title, "status": status,
                            "detail": detail, "instance": instance, "errors": [dict(e) for e in errors]}
    for key, value in (extensions or {}).items():
        body.setdefault(key, value)
    return body


def problem_body_of(error: ApiError, *, instance: str) -> dict[str, Any]:
    return problem_body(status=error.status, slug=error.slug, title=error.title, detail=error.detail,
                        instance=instance, errors=error.errors, extensions=error.extensions)


def problem_response(request: Request, error: ApiError) -> JSONResponse:
    body = problem_body_of(error, instance=request.url.path)
    return JSONResponse(body, status_code=error.status, headers=error.headers,
                        media_type=PROBLEM_MEDIA_TYPE)


# --------------------------------------------------------------------------- validation errors

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# pydantic puts the member of a union it tried into the location: 'int', "literal['auto']", ...
_UNION_TAGS = {"int", "float", "str", "bool", "dict", "list", "none", "bytes", "enum"}


def _field_path(loc: Sequence[int | str]) -> str:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(part) and part not in _UNION_TAGS:
            out += f".{part}" if out else part
    return out or "body"


def _message(err: Mapping[str, Any]) -> str:
    msg = str(err.get("msg", "invalid"))
    if err.get("type") == "extra_forbidden":
        return "unknown field"
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def validation_field_errors(errors: Sequence[Mapping[str, Any]]) -> list[FieldError]:
    seen: set[tuple[str, str]] = set()
    out: list[FieldError] = []
    for err in errors:
        item = (_field_path(err.get("loc", ())), _message(err))
        if item not in seen:
            seen.add(item)
            out.append(FieldError(*item))
    return out


def _from_validation(exc: RequestValidationError) -> ApiError:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        ctx = next(e.get("ctx") or {} for e in errors if e.get("type") == "json_invalid")
        return MalformedBody(f"the body is not valid JSON: {ctx.get('error', 'decode error')}",
                             errors=[FieldError("body", "not valid JSON")])
    fields = validation_field_errors(errors)
    detail = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:5])
    return InvalidInput(detail or "invalid input", errors=fields)


# --------------------------------------------------------------------------- Starlette's HTTP errors

_HTTP_SLUGS = {400: MalformedBody, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
               413: BodyTooLarge, 415: UnsupportedMediaType, 429: TooManyRequests}


def _from_http(exc: StarletteHTTPException, request: Request) -> JSONResponse:
    cls = _HTTP_SLUGS.get(exc.status_code)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no such resource: {request.method} {request.url.path}"
    if exc.status_code == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    headers = dict(exc.headers or {})
    if cls is not None:
        return problem_response(request, cls(detail, headers=headers))
    body = problem_body(status=exc.status_code, slug=f"http-{exc.status_code}",
                        title=_reason(exc.status_code), detail=detail, instance=request.url.path)
    return JSONResponse(body, status_code=exc.status_code, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def retry_after_header(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


# --------------------------------------------------------------------------- handlers


def install_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return problem_response(request, exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem_response(request, _from_validation(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return _from_http(exc, request)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        body = problem_body(status=500, slug="internal", title="Internal server error",
                            detail="the server failed; the error is logged", instance=request.url.path)
        return JSONResponse(body, status_code=500, media_type=PROBLEM_MEDIA_TYPE)

    async def on_database_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc)
        return problem_response(request, ServiceUnavailable(
            "the database is unavailable; retry shortly", headers={"Retry-After": "2"},
            errors=[FieldError("database", "unavailable")]))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(OperationalError, on_database_down)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


# --------------------------------------------------------------------------- OpenAPI

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Problem",
    "description": "RFC 9457 problem details.",
    "required": ["type", "title", "status", "detail", "instance", "errors"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "errors": {"type": "array", "items": {
            "type": "object", "required": ["field", "message"],
            "properties": {"field": {"type": "string", "description": "Dotted path, e.g. training.seq_len"},
                           "message": {"type": "string"}, "row": {"type": "integer"}}}},
    },
    "additionalProperties": True,
}


def document_problems(app: FastAPI) -> None:
    """Describe every 4xx/5xx response in the OpenAPI document as problem+json (FastAPI's default
    422 schema is not what the API sends)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas["Problem"] = PROBLEM_SCHEMA
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for code, response in operation.get("responses", {}).items():
                    if str(code)[0] in "45":
                        response["content"] = problem
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
