"""What the dashboard is served with, and the two read-only routes it reads besides the others."""

from __future__ import annotations

import json
import re

from planner.catalogue import catalogue
from store.status import ACTIVE, TERMINAL, JobStatus
from tests.api.conftest import Env


def test_the_page_and_its_files_are_served_at_the_root(env: Env) -> None:
    page = env.client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp
    assets = re.findall(r'(?:src|href)="(/dashboard/[^"]+)"', page.text)
    assert {"/dashboard/app.js", "/dashboard/vendor/uPlot.iife.min.js", "/dashboard/vendor/js-yaml.umd.min.js"
            } <= set(assets)
    for path in assets:
        res = env.client.get(path)
        assert res.status_code == 200 and len(res.content) > 100, path
    assert env.client.get("/dashboard/vendor/uPlot.LICENSE").text.startswith("The MIT License")
    assert "MIT" in env.client.get("/dashboard/vendor/js-yaml.LICENSE").text[:200]
    assert env.client.get("/dashboard/../api/app.py").status_code == 404
    assert "/" not in env.client.get("/openapi.json").json()["paths"]


def test_the_page_names_the_job_states_the_server_has(env: Env) -> None:
    """The dashboard's script reads the states from the server's own (``store.status``), not a copy."""
    res = env.client.get("/dashboard/states.js")
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/javascript")
    lists = dict(re.findall(r"const (\w+) = (?:new Set\()?(\[[^\]]*\])", res.text))
    assert json.loads(lists["STATUSES"]) == [s.value for s in JobStatus]
    assert set(json.loads(lists["TERMINAL"])) == {s.value for s in TERMINAL}
    assert set(json.loads(lists["ACTIVE"])) == {s.value for s in ACTIVE}
    page = env.client.get("/").text
    assert page.index("/dashboard/states.js") < page.index("/dashboard/app.js")
    script = env.client.get("/dashboard/app.js").text
    assert not re.search(r"const (STATUSES|TERMINAL|ACTIVE)\b", script)


def test_me_says_who_the_token_is(env: Env) -> None:
    assert env.client.get("/v1/me").status_code == 401
    alice = env.client.get("/v1/me", headers=env.auth("alice")).json()
    root = env.client.get("/v1/me", headers=env.auth("root")).json()
    assert alice == {"name": "alice", "is_admin": False, "reads_all_jobs": False}
    assert root == {"name": "root", "is_admin": True, "reads_all_jobs": True}


def test_the_catalogue_lists_the_planners_models(env: Env) -> None:
    assert env.client.get("/v1/catalogue/models").status_code == 401
    items = env.client.get("/v1/catalogue/models", headers=env.auth("bob")).json()["items"]
    assert {m["name"] for m in items} == set(catalogue())
    entry = catalogue()[items[0]["name"]]
    assert items[0]["num_parameters"] == entry.num_parameters
    assert items[0]["max_position_embeddings"] == entry.config.get("max_position_embeddings")
    planned = env.client.post(
        "/v1/plans",
        headers=env.auth("bob"),
        json={"model": {"name": items[0]["name"]}, "method": "lora", "training": {"seq_len": 512}},
    )
    assert planned.status_code == 200, planned.text
