"""``GET /`` serves the dashboard's page; its scripts, styles and the vendored chart library are under
``/dashboard/``. The page holds no data: it signs in with a token and calls ``/v1/...`` like any client."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from store.status import ACTIVE, TERMINAL, JobStatus

STATIC = Path(__file__).parent / "static"
PREFIX = "/dashboard"

# the page runs only its own files; the token it holds cannot be sent to another origin by injected code
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)

router = APIRouter(include_in_schema=False)


@router.get("/")
def index() -> FileResponse:
    return FileResponse(
        STATIC / "index.html",
        media_type="text/html",
        headers={
            "Cache-Control": "no-cache",
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )


def states_script() -> str:
    """The job states as the dashboard's script names them, from ``store.status``: every status in the
    lifecycle's order, the terminal ones and the ones that hold GPUs."""
    order = [status.value for status in JobStatus]
    return (f"const STATUSES = {json.dumps(order)};\n"
            f"const TERMINAL = new Set({json.dumps([s for s in order if s in TERMINAL])});\n"
            f"const ACTIVE = {json.dumps([s for s in order if s in ACTIVE])};\n")


@router.get(f"{PREFIX}/states.js")
def states() -> Response:
    return Response(states_script(), media_type="text/javascript",
                    headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


def install(app: FastAPI) -> None:
    """Serve the dashboard from ``app``: the page at ``/``, its files at ``/dashboard/``."""
    app.include_router(router)
    app.mount(PREFIX, StaticFiles(directory=STATIC), name="dashboard")
