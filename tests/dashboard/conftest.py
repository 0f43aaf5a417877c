"""The dashboard against a running ``tunebox serve`` (the embedded default: SQLite, the filesystem
broker and a worker beside the API) with a finished tiny job, driven by a real headless Chromium.

The "GPU" is the CPU standing in for one 24 GiB card; the job is real DeepSpeed training of a tiny
local Llama. Chromium and its driver are Debian's ``chromium`` and ``chromium-driver`` (``.ci/run``
installs them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import env, roots  # noqa: F401  (the route tests use the API fixtures)
from tests.tinydata import write_dataset
from tests.tinymodel import build_tiny_model
from tests.worker.harness import REPO, ApiServer, wait_job, worker_env

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
TERMINAL = {"succeeded", "failed", "cancelled"}
SHOTS = REPO / "docs" / "dashboard"
DESKTOP = (1280, 900)
PHONE = (390, 844)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_spec(name: str, max_steps: int, *, save_steps: int = 6, eval_when: str = "end") -> dict[str, Any]:
    return {
        "name": name,
        "model": {"path": "tiny"},
        "dataset": {"path": "repeat.jsonl", "format": "alpaca", "eval_fraction": 0.1},
        "method": "lora",
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": LORA_TARGETS},
        "training": {
            "max_steps": max_steps,
            "epochs": None,
            "learning_rate": 0.05,
            "lr_scheduler": "cosine",
            "warmup_ratio": 0.2,
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 1,
            "seq_len": 64,
            "precision": "fp32",
            "optimizer": "sgd",
            "save_steps": save_steps,
            "seed": 7,
        },
        # SGD on the card: no DeepSpeed op to compile (cpu_adam) before the first step
        "resources": {"num_gpus": 1, "zero_stage": 3, "offload_optimizer": "none", "offload_param": "none"},
        "eval": {"when": eval_when, "max_new_tokens": 8, "batch_size": 2, "num_samples": 2},
    }


@dataclass
class Service:
    api: ApiServer
    env: dict[str, str]
    tokens: dict[str, str]
    finished: dict[str, Any]

    def client(self, who: str = "alice") -> httpx.Client:
        return httpx.Client(
            base_url=self.api.base_url, timeout=30, headers={"Authorization": f"Bearer {self.tokens[who]}"}
        )

    def submit(self, spec: dict[str, Any], who: str = "alice") -> str:
        with self.client(who) as c:
            res = c.post("/v1/jobs", json=spec)
        assert res.status_code == 201, res.text
        return str(res.json()["id"])


def _token(environ: dict[str, str], name: str) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "tunebox.cli", "token", "create", name],
        env=environ,
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    return made.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    base = tmp_path_factory.mktemp("dashboard")
    build_tiny_model(base / "models" / "tiny")
    write_dataset(base / "data" / "repeat.jsonl", "alpaca", n=48)
    data = base / "service"
    environ = worker_env(
        f"sqlite:///{data / 'tunebox.db'}",
        None,
        data,
        train_module="worker.train",
        eval_module="worker.evaluate",
        model_roots=json.dumps([str(base / "models")]),
        dataset_roots=json.dumps([str(base / "data")]),
        progress_interval_s=0.3,
        cancel_grace_s=5,
        lease_ttl_s=60,
    )
    environ.pop("TUNEBOX_DATABASE_URL")  # the embedded default: DATA_DIR/tunebox.db
    # DeepSpeed's ops are built against this environment's headers: their cache belongs to it
    environ["TUNEBOX_TORCH_EXTENSIONS_DIR"] = str(Path(sys.prefix) / "torch_extensions")
    environ.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    api = ApiServer(environ, base / "serve.log").start()
    try:
        tokens = {"admin": api.token, "alice": _token(environ, "alice"), "bob": _token(environ, "bob")}
        svc = Service(api, environ, tokens, {})
        job_id = svc.submit(tiny_spec("tiny-finished", 12))
        with svc.client() as c:
            job = wait_job(c, job_id, TERMINAL, 1200, api)
        assert job["status"] == "succeeded", (job["failure"], job["log_tail"], api.log_text()[-3000:])
        svc.finished = job
        yield svc
    finally:
        api.stop()


class Browser:
    """A headless Chromium page on the service, with the waits the tests need."""

    def __init__(self, driver: Any, base_url: str) -> None:
        self.driver, self.base_url = driver, base_url

    def size(self, width_height: tuple[int, int]) -> None:
        self.driver.set_window_size(*width_height)

    def sign_in(self, token: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver.get(self.base_url + "/")
        self.driver.execute_script("sessionStorage.clear()")
        self.driver.get(self.base_url + "/")
        self.wait_page("signin")
        self.driver.find_element(By.NAME, "token").send_keys(token)
        self.driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
        self.wait_page("box")

    def open(self, hash_path: str, page: str, *, expect_error: bool = False) -> None:
        self.driver.execute_script(
            "delete document.body.dataset.loaded; location.hash = arguments[0]", hash_path
        )
        self.wait_page(page)
        error = self.js("const e = document.getElementById('error'); return e.hidden ? null : e.textContent")
        assert (error is not None) == expect_error, error

    def wait_page(self, page: str, timeout: float = 30) -> None:
        self.until(
            lambda: self.js(
                "return document.body.dataset.page === arguments[0] && Boolean(document.body.dataset.loaded)",
                page,
            ),
            timeout,
            f"page {page}",
        )

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def until(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.2)
        error = self.js("return document.getElementById('error').textContent")
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; page error: {error!r}")

    def text(self, css: str) -> str:
        from selenium.webdriver.common.by import By

        return str(self.driver.find_element(By.CSS_SELECTOR, css).text)

    def no_horizontal_scroll(self) -> bool:
        return bool(self.js("return document.documentElement.scrollWidth <= window.innerWidth + 1"))

    def screenshot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        # the whole page, not only the window: the document's height at this width
        width = self.js("return window.innerWidth")
        height = self.js("return document.documentElement.scrollHeight")
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
        )
        try:
            path.write_bytes(self.driver.get_screenshot_as_png())
        finally:
            self.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        return path


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--force-device-scale-factor=1",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=DriverService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: Any, service: Service) -> Iterator[Browser]:
    page = Browser(chromium, service.api.base_url)
    page.size(DESKTOP)
    yield page
    page.js("sessionStorage.clear()")
