"""A small HTTP client of the tunebox API (what the CLI uses).

Errors come back as :class:`ApiProblem` carrying the RFC 9457 body; an unreachable server is a
:class:`ClientError` with the URL it tried.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


class ClientError(Exception):
    """The request did not produce an API answer (server down, bad URL, no token)."""


class ApiProblem(ClientError):
    """The API answered with an error; ``problem`` is its problem+json body."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}".strip())

    @property
    def errors(self) -> list[dict[str, Any]]:
        return list(self.problem.get("errors") or [])


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = (url or os.environ.get("TUNEBOX_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("TUNEBOX_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            res = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach {self.url} ({exc}): is `tunebox serve` running there? "
                              "TUNEBOX_URL names the server") from exc
        if res.status_code >= 400:
            raise ApiProblem(res.status_code, _problem_body(res))
        return res.json() if res.content else None

    # ------------------------------------------------------------------ jobs

    def submit(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return dict(self._request("POST", "/v1/jobs", json=spec, headers=headers))

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self._request("POST", "/v1/plans", json=spec))

    def jobs(self, *, statuses: Sequence[str] = (), owner: str | None = None, after: str | None = None,
             limit: int = 50) -> dict[str, Any]:
        params: list[tuple[str, str | int]] = [("limit", limit)] + [("status", s) for s in statuses]
        if owner:
            params.append(("owner", owner))
        if after:
            params.append(("after", after))
        return dict(self._request("GET", "/v1/jobs", params=params))

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/jobs/{job_id}"))

    def gpus(self) -> dict[str, Any]:
        return self._request("GET", "/v1/gpus")  # type: ignore[no-any-return]

    def calibration(self) -> dict[str, Any]:
        return self._request("GET", "/v1/calibration")  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/v1/jobs/{job_id}/cancel"))

    def download(self, job_id: str, dest: Path, *, step: int | None = None) -> Path:
        """A checkpoint (``step``) or the final adapter as ``.tar.gz``, written to ``dest``."""
        path = f"/v1/jobs/{job_id}/" + ("adapter" if step is None else f"checkpoints/{step}/archive")
        try:
            with self._http.stream("GET", path) as res:
                if res.status_code >= 400:
                    res.read()
                    raise ApiProblem(res.status_code, _problem_body(res))
                with dest.open("wb") as out:
                    for chunk in res.iter_bytes():
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot download from {self.url}: {exc}") from exc
        return dest

    def pause(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/v1/jobs/{job_id}/pause"))

    def resume(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/v1/jobs/{job_id}/resume"))

    def events(self, job_id: str, *, after: int = 0, limit: int = 200) -> dict[str, Any]:
        params = {"after": after, "limit": limit}
        return dict(self._request("GET", f"/v1/jobs/{job_id}/events", params=params))

    def all_events(self, job_id: str) -> list[dict[str, Any]]:
        """Every event of the job so far, oldest first."""
        return self._every(f"/v1/jobs/{job_id}/events", after=0)

    def _every(self, path: str, *, after: str | int | None = None) -> list[dict[str, Any]]:
        """The items of every page of a list route that pages with ``after`` / ``next_after``."""
        items: list[dict[str, Any]] = []
        while True:
            params: dict[str, str | int] = {"limit": 200} if after is None else {"limit": 200, "after": after}
            page = self._request("GET", path, params=params)
            items.extend(page["items"])
            if not page["items"] or page.get("next_after") in (None, after):
                return items
            after = page["next_after"]

    def metrics(self, job_id: str, *, kind: str = "train") -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/jobs/{job_id}/metrics", params={"kind": kind}))

    def checkpoints(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/jobs/{job_id}/checkpoints"))

    def upload_dataset(self, path: Path, *, name: str | None = None, fmt: str = "auto",
                       shared: bool = False) -> dict[str, Any]:
        """Stream ``path`` (JSON Lines or a JSON array) to the server, which validates and stores it."""
        params: dict[str, str] = {"format": fmt, "shared": "true" if shared else "false",
                                  "name": name or path.name}
        with path.open("rb") as fh:
            return dict(self._request("POST", "/v1/datasets", params=params, content=fh))

    def all_datasets(self) -> list[dict[str, Any]]:
        """Every dataset the token may list, newest first."""
        return self._every("/v1/datasets")

    def update_dataset(self, dataset_id: str, **change: Any) -> dict[str, Any]:
        return dict(self._request("PATCH", f"/v1/datasets/{dataset_id}", json=change))

    def queue(self, *, limit: int = 200) -> dict[str, Any]:
        return dict(self._request("GET", "/v1/queue", params={"limit": limit}))

    def logs(self, job_id: str, *, tail: int | None = None, follow: bool = False) -> Iterator[str]:
        """The training log's text as it arrives; with ``follow``, until the job ends."""
        params: dict[str, str | int] = {"follow": "true" if follow else "false"}
        if tail is not None:
            params["tail"] = tail
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params,
                                   timeout=httpx.Timeout(30.0, read=None if follow else 30.0)) as res:
                if res.status_code >= 400:
                    res.read()
                    raise ApiProblem(res.status_code, _problem_body(res))
                yield from res.iter_text()
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot read the log from {self.url}: {exc}") from exc

    def stream_events(self, job_id: str, *, last_event_id: int | None = None) -> Iterator[dict[str, Any]]:
        """Events from the SSE stream as they happen; ends when the server ends the stream."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers,
                                   timeout=httpx.Timeout(30.0, read=None)) as res:
                if res.status_code >= 400:
                    res.read()
                    raise ApiProblem(res.status_code, _problem_body(res))
                yield from _parse_sse(res.iter_lines())
        except httpx.HTTPError as exc:
            raise ClientError(f"event stream from {self.url} broke: {exc}") from exc


def _problem_body(res: httpx.Response) -> dict[str, Any]:
    try:
        body = res.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"status": res.status_code, "title": res.reason_phrase, "detail": res.text[:500]}
    return body if isinstance(body, dict) else {"status": res.status_code, "detail": str(body)}


def _parse_sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """SSE frames as ``{"event": kind, "id": id or None, "data": decoded JSON}``; comments skipped."""
    frame: dict[str, str] = {}
    for line in lines:
        if not line:
            if "data" in frame:
                yield {"event": frame.get("event", "message"), "id": frame.get("id"),
                       "data": json.loads(frame["data"])}
            frame = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            frame[key] = value[1:] if value.startswith(" ") else value
