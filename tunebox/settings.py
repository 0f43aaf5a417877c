"""Settings from ``TUNEBOX_*`` environment variables (or a ``.env``-style settings file).

Grouped by concern; every field is described, and the README's settings table is generated from
these descriptions (``tunebox settings --markdown``). Lists are JSON arrays, as pydantic-settings
reads them: ``TUNEBOX_MODEL_ROOTS='["/models"]'``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from planner.constants import HOST_CLOCK_FACTOR_BOUNDS


def _default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "tunebox"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TUNEBOX_",
        env_file=os.environ.get("TUNEBOX_SETTINGS_FILE"),
        extra="ignore",
    )

    # --- storage
    data_dir: Annotated[Path, Field(description="Everything the service writes by default: the "
                                    "SQLite file, the embedded broker's folder, datasets, job folders.")] = (
        Field(default_factory=_default_data_dir))
    database_url: Annotated[str | None, Field(description="SQLAlchemy URL; default: SQLite file "
                                              "`DATA_DIR/tunebox.db`. Production: "
                                              "`postgresql+psycopg://user@host/db`.")] = None
    # --- broker
    broker_url: Annotated[str | None, Field(description="Celery broker; default: kombu's server-less "
                                            "filesystem transport under `DATA_DIR/broker`. "
                                            "Production: `redis://host:6379/0`.")] = None
    visibility_timeout_s: Annotated[int, Field(ge=60, description="Broker visibility timeout; longer "
                                               "than any run so a long job is never delivered twice.")] = (
        7 * 24 * 3600)
    # --- paths users may name in specs
    model_roots: Annotated[list[Path], Field(description="Folders that `model.path` must lie under "
                                             "(JSON array).")] = Field(default_factory=list)
    dataset_roots: Annotated[list[Path], Field(description="Folders that `dataset.path` must lie "
                                               "under (JSON array); uploads go to `DATA_DIR/datasets`.")] = (
        Field(default_factory=list))
    # --- API
    max_body_bytes: Annotated[int, Field(ge=1024, description="Largest request body accepted.")] = (
        64 * 2**20)
    max_dataset_rows: Annotated[int, Field(ge=1, description="Most rows in one uploaded dataset.")] = (
        1_000_000)
    submit_rate_per_minute: Annotated[int, Field(ge=1, description="Job submissions per token per "
                                                 "minute.")] = 120
    max_queued_jobs_per_user: Annotated[int, Field(ge=1, description="Queued jobs one user may "
                                                   "hold.")] = 100
    max_gpus_per_user: Annotated[int, Field(ge=1, description="GPUs one user's running jobs may "
                                            "hold at once.")] = 64
    team_reads: Annotated[bool, Field(description="Let every user read every job's spec, plan, "
                                      "events, logs, metrics and checkpoints, and list and train on "
                                      "every uploaded dataset. Off: those are their owner's and the "
                                      "admins' (404 to others); everyone sees the queue either "
                                      "way.")] = False
    # --- worker and box
    gpu_count: Annotated[int | None, Field(ge=0, description="GPUs of this box where NVML sees none "
                                           "(the CPU stands in for them).")] = None
    gpu_memory_bytes: Annotated[int | None, Field(ge=0, description="Memory of each GPU where NVML "
                                                  "sees none.")] = None
    host_memory_bytes: Annotated[int | None, Field(ge=0, description="Host RAM the planner may use; "
                                                   "default: the machine's.")] = None
    nvme_bytes: Annotated[int, Field(ge=0, description="NVMe space for offload; 0 turns NVMe "
                                     "offload off. Where DeepSpeed's async I/O op does not build (it "
                                     "needs libaio and its headers, `libaio-dev`), plans for this box "
                                     "refuse NVMe offload and say so.")] = 0
    nvme_path: Annotated[Path | None, Field(description="Folder for NVMe offload swap files.")] = None
    host_clock_factor: Annotated[float | None, Field(
        ge=HOST_CLOCK_FACTOR_BOUNDS[0], le=HOST_CLOCK_FACTOR_BOUNDS[1],
        description="This host's clock over the planner's calibration host's; default: probed on a box "
                    "with NVIDIA GPUs. Plans scale the host-bound part of a step (Python, kernel "
                    "launches, ZeRO-3's hooks) by it.")] = None
    host_probe: Annotated[bool, Field(description="Probe this host's clock (a child process) "
                                      "when the settings give no host_clock_factor.")] = True
    host_probe_max_age_s: Annotated[float, Field(gt=0, description="Probe the host's clock again, in "
                                                 "the background, once its figure is this old: the same "
                                                 "box's host speed moves from minute to minute.")] = 600.0
    box_probe: Annotated[bool, Field(description="Measure this box's GPUs and host once per GPU, driver, "
                                     "torch and DeepSpeed version (a child process at worker start: "
                                     "CUDA context, matmul rate, PCIe copies, CPU Adam rate, free RAM "
                                     "and disk); plans for the box use its figures.")] = True
    box_probe_timeout_s: Annotated[float, Field(gt=0, description="Seconds the box probe may run; past "
                                                "them it is stopped and plans use the GPU catalogue, "
                                                "then the settings.")] = 300.0
    box_probe_module: Annotated[str, Field(description="Python module run as the box probe "
                                           "(`python -m MODULE --nvme-dir DIR`).")] = "tunebox.probe"
    lease_ttl_s: Annotated[int, Field(ge=5, description="A GPU lease expires this long after its "
                                      "last heartbeat.")] = 120
    cancel_grace_s: Annotated[float, Field(ge=0, description="Seconds between SIGTERM and SIGKILL "
                                           "when a job is cancelled.")] = 20.0
    max_attempts: Annotated[int, Field(ge=1, description="Runs of one job before a lost worker ends "
                                       "it `failed`.")] = 3
    progress_interval_s: Annotated[float, Field(ge=0, description="Least time between two progress "
                                                "writes to the database.")] = 2.0
    embedded_worker: Annotated[bool | None, Field(description="Start a worker inside `tunebox serve`; "
                                                  "default: only on the embedded broker.")] = None
    worker_host: Annotated[str | None, Field(description="Name of this box in the GPU inventory; "
                                             "default: the host name.")] = None
    gpu_share_margin: Annotated[float, Field(ge=0, le=0.9, description="Share of a card kept free "
                                             "when two jobs' planned peaks share it.")] = 0.10
    inventory_interval_s: Annotated[float, Field(gt=0, description="Seconds between two GPU "
                                                 "inventory refreshes by a worker.")] = 30.0
    reconcile_interval_s: Annotated[float, Field(gt=0, description="Seconds between two runs of "
                                                 "the reconciler in a worker.")] = 30.0
    worker_concurrency: Annotated[int, Field(ge=0, le=1024, description="Jobs one `tunebox worker` "
                                             "supervises at once; 0: two per GPU (two jobs may "
                                             "share a card).")] = 0
    lease_wait_s: Annotated[float, Field(gt=0, description="Seconds a job whose GPUs are busy waits "
                                         "before it tries again.")] = 5.0
    requeue_after_s: Annotated[float, Field(gt=0, description="A job queued this long with no "
                                            "message on the broker is sent again.")] = 300.0
    train_module: Annotated[str, Field(description="Python module run as the training process "
                                       "(`python -m MODULE --job-dir DIR`).")] = "worker.train"
    eval_module: Annotated[str, Field(description="Python module run as the evaluation process.")] = (
        "worker.evaluate")
    use_deepspeed_launcher: Annotated[bool, Field(description="Start multi-GPU training with the "
                                                  "`deepspeed` launcher instead of one process "
                                                  "per GPU.")] = False
    torch_extensions_dir: Annotated[Path | None, Field(description="Cache of compiled DeepSpeed ops; "
                                                       "default: `DATA_DIR/torch_extensions`.")] = None
    prebuild_ops: Annotated[list[Literal["cpu_adam", "fused_adam", "cpu_lion", "fused_lion", "async_io"]],
                            Field(description="DeepSpeed ops a worker builds (or loads) in the background "
                                  "when it starts, so jobs do not wait for the first build; an op the "
                                  "box's accelerator lacks is skipped. Empty: none.")] = [
        "cpu_adam", "fused_adam"]
    gpu_memory_limit_bytes: Annotated[int | None, Field(ge=2**28, description="Memory of each card "
                                                        "that jobs may use, where the box keeps the rest "
                                                        "for other work: the inventory, plans, leases "
                                                        "and the training's allocator limit all take "
                                                        "the smaller of this and the card's memory. "
                                                        "Unset: the whole card.")] = None
    limit_gpu_memory: Annotated[bool, Field(description="Limit PyTorch's allocator in every training "
                                            "process to the plan's `per_gpu.allocator_limit_bytes` "
                                            "(plus the tolerance): past it the allocator gives cached "
                                            "blocks back, and a job that still needs more fails "
                                            "`cuda_oom` itself instead of growing into a neighbour. "
                                            "Such a job, where its card holds more, is planned again "
                                            "with the peak it reached and queued once more.")] = True
    gpu_memory_tolerance: Annotated[float, Field(ge=0, le=1, description="Share of the planned peak "
                                                 "a job may use beyond its plan (the estimator's error "
                                                 "band), and the headroom a job planned again after "
                                                 "`cuda_oom` gets over the peak it reached; the card's "
                                                 "share margin holds it.")] = 0.05
    job_address_space_bytes: Annotated[int | None, Field(ge=2**28, description="Cap on the address "
                                                          "space (RLIMIT_AS) of each training and "
                                                          "evaluation process: a job that outgrows it "
                                                          "fails `host_oom` instead of starving the "
                                                          "box's other jobs. Unset: no cap.")] = None

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'tunebox.db'}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def embedded(self) -> bool:
        return self.broker_url is None


@lru_cache
def get_settings() -> Settings:
    return Settings()
