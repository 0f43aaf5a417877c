"""Each page of the dashboard in headless Chromium against ``tunebox serve`` with a finished tiny job."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.dashboard.conftest import DESKTOP, PHONE, TERMINAL, Browser, Service, tiny_spec
from tests.worker.harness import wait_job

pytestmark = pytest.mark.slow

# the colour app.js draws the planned peak with (COLORS.peak)
PEAK_RGB = (0xDC, 0x26, 0x26)

CHARTS_JS = """
const out = {};
for (const [k, u] of Object.entries(window.tunebox.charts)) {
  out[k] = {labels: u.series.map(s => s.label), data: u.data};
}
return out;"""

# share of the plotting area's pixels of one canvas row that have the peak colour
ROW_SHARE_JS = """
const [key, value, rgb, offset] = arguments;
const u = window.tunebox.charts[key];
const y = Math.round(u.valToPos(value, 'y', true)) + offset;
const {left, width} = u.bbox;
const px = u.ctx.getImageData(Math.round(left), y - 1, Math.round(width), 3).data;
let hits = 0;
for (let x = 0; x < Math.round(width); x++) {
  let hit = false;
  for (let r = 0; r < 3; r++) {
    const i = (r * Math.round(width) + x) * 4;
    const near = [0, 1, 2].every(c => Math.abs(px[i + c] - rgb[c]) < 40);
    if (near && px[i + 3] > 200) hit = true;
  }
  if (hit) hits++;
}
return hits / Math.round(width);"""


def api_get(service: Service, path: str, who: str = "alice") -> Any:
    with service.client(who) as c:
        res = c.get(path)
    assert res.status_code == 200, res.text
    return res.json()


def test_the_job_page_draws_the_apis_points_and_the_plan(browser: Browser, service: Service) -> None:
    job = service.finished
    job_id, plan = job["id"], job["plan"]
    train = api_get(service, f"/v1/jobs/{job_id}/metrics?kind=train")["points"]
    evals = api_get(service, f"/v1/jobs/{job_id}/metrics?kind=eval")["points"]
    events = api_get(service, f"/v1/jobs/{job_id}/events?limit=1000")["items"]
    checkpoints = api_get(service, f"/v1/jobs/{job_id}/checkpoints")["items"]
    assert len(train) >= 2 and checkpoints

    browser.sign_in(service.tokens["alice"])
    browser.open(f"#/jobs/{job_id}", "job")
    browser.until(
        lambda: browser.js("return document.querySelectorAll('#events [data-event]').length") == len(events),
        30,
        "the event stream's history",
    )
    charts = browser.js(CHARTS_JS)
    steps = [p["step"] for p in train]

    loss = charts["loss"]
    assert loss["labels"] == ["step", "train", "eval"]
    assert loss["data"][0] == sorted({*steps, *(p["step"] for p in evals)})
    at = {s: i for i, s in enumerate(loss["data"][0])}
    assert [loss["data"][1][at[p["step"]]] for p in train] == [p["loss"] for p in train]
    assert [loss["data"][2][at[p["step"]]] for p in evals] == [p["loss"] for p in evals]
    assert charts["lr"]["data"] == [steps, [p["learning_rate"] for p in train]]
    assert charts["tps"]["data"] == [steps, [p["tokens_per_second"] for p in train]]
    assert len(set(charts["lr"]["data"][1])) > 2  # warmup then cosine: a curve, not a constant

    gpu, peak, capacity = charts["gpu"], plan["per_gpu"]["total_bytes"], plan["per_gpu"]["capacity_bytes"]
    assert gpu["labels"] == ["step", "measured", "planned peak", "capacity"]
    assert gpu["data"][1] == [p["gpu_memory_bytes"] for p in train]
    assert gpu["data"][2] == [peak] * len(train) and gpu["data"][3] == [capacity] * len(train)
    on_line = browser.js(ROW_SHARE_JS, "gpu", peak, list(PEAK_RGB), 0)
    beside = browser.js(ROW_SHARE_JS, "gpu", peak, list(PEAK_RGB), 12)
    assert on_line > 0.4 and beside < 0.05, (on_line, beside)  # drawn dashed at its value, nowhere near

    host = charts["host"]
    assert host["data"][1] == [p["host_rss_bytes"] for p in train]
    assert host["data"][2] == [plan["host"]["total_bytes"]] * len(train)
    assert any(v for v in host["data"][1])

    segments = browser.js(
        "return [...document.querySelectorAll('[data-plot=plan-terms] .seg')]"
        ".map(e => [e.dataset.term, Number(e.dataset.bytes)])"
    )
    expected = [(k, plan["per_gpu"][k]) for k in _TERMS if plan["per_gpu"][k] > 0]
    assert sorted(map(tuple, segments)) == sorted(expected)
    total_left = browser.js(
        "const m = document.querySelector('[data-mark=total]');return m.offsetLeft / m.parentNode.clientWidth"
    )
    scale = max(sum(v for _, v in expected), peak, capacity)
    assert total_left == pytest.approx(peak / scale, abs=0.01)

    transitions = [
        "queued" if e["kind"] == "created" else e["data"]["to"]
        for e in events
        if e["kind"] in ("created", "status")
    ]
    assert (
        browser.js("return [...document.querySelectorAll('#timeline li')].map(e => e.dataset.to)")
        == transitions
    )
    assert transitions[-1] == "succeeded"
    shown = browser.js(
        "return [...document.querySelectorAll('#checkpoints [data-checkpoint]')]"
        ".map(e => e.dataset.checkpoint)"
    )
    assert shown == [c["id"] for c in checkpoints]
    assert browser.js("return document.querySelectorAll('[data-action=cancel]').length") == 0  # finished
    browser.screenshot("job")

    # a checkpoint's archive comes from the API with the owner's token, under the API's file name
    step = checkpoints[0]["step"]
    browser.js("document.querySelector('[data-download=\"' + arguments[0] + '\"]').click()", str(step))
    saved = browser.until(
        lambda: browser.js("return document.querySelector('[data-download=\"' + arguments[0] + '\"]')"
                           ".dataset.downloaded", str(step)),
        60,
        "the checkpoint's archive",
    )
    assert saved.endswith(f"step-{step}.tar.gz"), saved


_TERMS = {
    "weights_bytes",
    "gradients_bytes",
    "optimizer_states_bytes",
    "activations_bytes",
    "logits_bytes",
    "zero_buffers_bytes",
    "gathered_parameters_bytes",
    "optimizer_step_transient_bytes",
    "cuda_context_bytes",
    "allocator_slack_bytes",
}


def _plan_form(browser: Browser, **fields: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.open("#/plan", "plan")
    for name, value in fields.items():
        el = browser.driver.find_element(By.NAME, name)
        if el.tag_name == "select":
            Select(el).select_by_value(value)
        else:
            el.clear()
            if name == "spec":  # a long pasted spec: set at once, as a paste does
                browser.js("arguments[0].value = arguments[1]", el, value)
            else:
                el.send_keys(value)
    browser.js("delete document.body.dataset.loaded")
    browser.driver.find_element(By.CSS_SELECTOR, "#main form button[type=submit]").click()
    browser.wait_page("plan")


def test_the_plan_form_shows_the_alternatives_of_a_refused_spec(browser: Browser, service: Service) -> None:
    names = [m["name"] for m in api_get(service, "/v1/catalogue/models")["items"]]
    name = next(n for n in names if "7B" in n)
    spec = {
        "name": "dashboard-plan",
        "model": {"name": name},
        "method": "full",
        "training": {"seq_len": 2048},
        "hardware": {"gpu_count": 1, "gpu_memory_bytes": 24 * 2**30, "host_memory_bytes": 32 * 2**30},
    }
    with service.client() as c:
        plan = c.post("/v1/plans", json=spec).json()
    assert plan["fits"] is False and plan["alternatives"]

    browser.sign_in(service.tokens["alice"])
    _plan_form(
        browser,
        model_source="name",
        model=name,
        method="full",
        seq_len="2048",
        gpu_count="1",
        gpu_memory_gib="24",
        host_memory_gib="32",
    )
    assert browser.text("#fits") == "does not fit"
    rows = browser.js(
        "return [...document.querySelectorAll('#alternatives tbody tr')]"
        ".map(r => [r.cells[1].textContent, r.dataset.fits])"
    )
    assert rows == [
        [
            ", ".join(f"{k} = {json.dumps(v, separators=(',', ':'))}" for k, v in a["changes"].items()),
            str(a["fits"]).lower(),
        ]
        for a in plan["alternatives"]
    ]
    assert browser.js("return document.getElementById('submit-job').disabled") is True
    advice = browser.js("return [...document.querySelectorAll('.notes li')].map(e => e.dataset.code)")
    assert advice == [n["code"] for n in plan["warnings"] + plan["advice"]]
    browser.screenshot("plan")


def test_the_live_page_follows_a_running_job_and_its_owner_cancels_it(
    browser: Browser, service: Service
) -> None:
    from selenium.webdriver.common.by import By

    browser.sign_in(service.tokens["alice"])
    # pasted as the YAML file `tunebox submit` reads
    live = tiny_spec("tiny-live", 2000, save_steps=10_000, eval_when="none")
    _plan_form(browser, spec=yaml.safe_dump(live))
    assert browser.text("#fits") == "fits"
    browser.driver.find_element(By.ID, "submit-job").click()
    browser.until(
        lambda: browser.js("return location.hash.startsWith('#/jobs/job_')"), 30, "the new job's page"
    )
    job_id = browser.js("return location.hash.slice(7)")
    browser.wait_page("job")
    browser.js("window.sameDocument = true")

    def points() -> int:
        return int(browser.js("const u = window.tunebox.charts.loss; return u ? u.data[0].length : 0"))

    browser.until(lambda: points() >= 2, 300, "the first steps drawn live")
    first = points()
    browser.until(lambda: points() >= first + 3, 120, "more steps drawn live")
    assert browser.js("return window.sameDocument === true")  # updated in place, never reloaded
    statuses = browser.js("return [...document.querySelectorAll('#timeline li')].map(e => e.dataset.to)")
    assert "running" in statuses
    train = api_get(service, f"/v1/jobs/{job_id}/metrics?kind=train")["points"]
    drawn = browser.js("return window.tunebox.charts.loss.data")
    assert drawn[0] == [p["step"] for p in train][: len(drawn[0])]  # the API's points, in order
    browser.screenshot("job-live")

    browser.open("#/", "box")
    shown = browser.js(
        "return [...document.querySelectorAll('.gpu')].map(g => "
        "[g.dataset.gpu, [...g.querySelectorAll('a')].map(a => a.textContent)])"
    )
    gpus = api_get(service, "/v1/gpus")["items"]
    assert [g[0] for g in shown] == [f"{g['host']}:{g['index']}" for g in gpus]
    for (_, held), gpu in zip(shown, gpus, strict=True):  # the job keeps its lease while the page draws
        assert held == [lease["job_id"] for lease in gpu["leases"]], gpus
    assert browser.js(
        "return document.querySelector('#running [data-job=\"' + arguments[0] + '\"]') !== null", job_id
    )
    browser.screenshot("box")
    browser.open("#/jobs?status=running", "jobs")
    assert browser.js(
        "return [...document.querySelectorAll('#jobs [data-job]')].map(r => r.dataset.job)"
    ) == [job_id]
    browser.open("#/jobs?status=failed", "jobs")
    assert browser.js("return document.querySelectorAll('#jobs [data-job]').length") == 0
    browser.open("#/jobs", "jobs")
    browser.screenshot("jobs")

    browser.open(f"#/jobs/{job_id}", "job")
    browser.driver.find_element(By.CSS_SELECTOR, "[data-action=cancel]").click()
    with service.client() as c:
        assert wait_job(c, job_id, TERMINAL, 120, service.api)["status"] == "cancelled"
    browser.until(
        lambda: (
            browser.js("return document.querySelector('.head [data-status]').dataset.status") == "cancelled"
        ),
        30,
        "the page to show the job cancelled",
    )


def test_another_user_sees_the_queue_but_not_the_details(browser: Browser, service: Service) -> None:
    job_id = service.finished["id"]
    browser.sign_in(service.tokens["bob"])
    browser.open("#/jobs", "jobs")
    row = browser.js(
        "const r = document.querySelector('#jobs [data-job=\"' + arguments[0] + '\"]');"
        "return r && [...r.cells].map(c => c.textContent)",
        job_id,
    )
    assert row is not None and "succeeded" in row and "alice" in row
    assert "12 / 12" not in " ".join(row)  # progress is alice's
    browser.open(f"#/jobs/{job_id}", "job", expect_error=True)
    assert "no job" in browser.text("#error")
    assert browser.js("return document.querySelectorAll('[data-action]').length") == 0


def test_the_jobs_page_filters_by_model(browser: Browser, service: Service) -> None:
    browser.sign_in(service.tokens["alice"])
    everything = api_get(service, "/v1/jobs")["items"]
    assert {j["model"] for j in everything} == {"tiny"}
    browser.open("#/jobs?model=tiny", "jobs")
    rows = browser.js("return [...document.querySelectorAll('#jobs [data-job]')].map(r => r.dataset.job)")
    assert rows == [j["id"] for j in everything]
    models = browser.js("return [...document.querySelectorAll('#jobs [data-model]')]"
                        ".map(c => c.dataset.model)")
    assert models == ["tiny"] * len(rows)
    browser.open("#/jobs?model=other", "jobs")
    assert browser.js("return document.querySelectorAll('#jobs [data-job]').length") == 0


@pytest.mark.parametrize("where", ["#/", "#/jobs", "job", "#/plan"])
def test_every_page_fits_a_phone(browser: Browser, service: Service, where: str) -> None:
    browser.size(PHONE)
    browser.sign_in(service.tokens["alice"])
    page = {"#/": "box", "#/jobs": "jobs", "#/plan": "plan"}.get(where, "job")
    browser.open(f"#/jobs/{service.finished['id']}" if where == "job" else where, page)
    assert browser.no_horizontal_scroll()
    if page == "job":
        widths = browser.js("return Object.values(window.tunebox.charts).map(u => u.root.offsetWidth)")
        assert widths and max(widths) <= PHONE[0]
        browser.screenshot("job-phone")
    browser.size(DESKTOP)
