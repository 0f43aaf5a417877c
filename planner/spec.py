"""The job spec: the body of ``POST /v1/plans`` and ``POST /v1/jobs`` (see DESIGN.md).

Every model forbids unknown fields and bounds every number, so a typo or an absurd value is a
422 naming the field rather than a surprise hours into a run.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planner.constants import HOST_CLOCK_FACTOR_BOUNDS
from planner.enums import Method, OffloadDevice, Optimizer, Precision

__all__ = ["AUTO", "Auto", "JobSpec", "Method", "OffloadDevice", "Optimizer", "Precision"]

Auto = Literal["auto"]
AUTO: Auto = "auto"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class DatasetFormat(StrEnum):
    ALPACA = "alpaca"
    SHAREGPT = "sharegpt"
    OPENAI = "openai"
    TEXT = "text"
    AUTO = "auto"


class LrScheduler(StrEnum):
    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"


class EvalWhen(StrEnum):
    END = "end"
    STEPS = "steps"
    NONE = "none"


class ModelRef(_Strict):
    """Exactly one of ``path`` (a local HF folder), ``name`` (catalogue) or ``config`` (config.json)."""

    path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    config: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelRef:
        given = [k for k in ("path", "name", "config") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"model needs exactly one of path, name, config (got {given or 'none'})")
        return self


class DataSource(_Strict):
    """Where rows come from: exactly one of ``path`` (a file or a LLaMA-Factory folder) or ``id``."""

    path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    id: Annotated[str, Field(pattern=r"^ds_[A-Za-z0-9]{1,64}$")] | None = None
    format: DatasetFormat = DatasetFormat.AUTO
    name: Annotated[str, Field(min_length=1, max_length=256,
                               description="the entry of a LLaMA-Factory dataset_info.json at path")
                    ] | None = None
    num_rows: Annotated[int, Field(ge=1, le=100_000_000)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> DataSource:
        if (self.path is None) == (self.id is None):
            raise ValueError("dataset needs exactly one of path, id")
        if self.name is not None and self.path is None:
            raise ValueError("dataset.name picks an entry of a dataset_info.json: it needs dataset.path")
        return self


class DatasetRef(DataSource):
    """The training rows; ``eval_fraction`` of them are held out for evaluation unless ``eval.dataset``
    names the evaluation rows."""

    eval_fraction: Annotated[float, Field(ge=0.0, le=0.5)] = 0.05
    #: refuse the job when more than this share of its training rows has no answer token within seq_len
    max_dropped_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.01
    #: tokens of all rows after truncation to seq_len (``tunebox dataset inspect`` reports it): packed
    #: training takes this many tokens per epoch
    num_tokens: Annotated[int, Field(ge=1, le=10**13)] | None = None
    #: the rows of seq_len tokens packing makes of all rows, whole examples in each (the inspection's
    #: ``packed_rows`` at this seq_len): a packed step takes micro_batch of them, however full
    num_packed_rows: Annotated[int, Field(ge=1, le=100_000_000)] | None = None


class LoraSpec(_Strict):
    r: Annotated[int, Field(ge=1, le=4096)] = 16
    alpha: Annotated[float, Field(gt=0, le=65536)] = 32
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.05
    target_modules: Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]],
                              Field(min_length=1, max_length=64)] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class TrainingSpec(_Strict):
    epochs: Annotated[float, Field(gt=0, le=1000)] | None = 3
    max_steps: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    learning_rate: Annotated[float, Field(gt=0, le=1.0)] = 2.0e-4
    lr_scheduler: LrScheduler = LrScheduler.COSINE
    warmup_ratio: Annotated[float, Field(ge=0.0, le=0.5)] = 0.03
    micro_batch_size: Annotated[int, Field(ge=1, le=4096)] | Auto = AUTO
    gradient_accumulation_steps: Annotated[int, Field(ge=1, le=65536)] = 8
    seq_len: Annotated[int, Field(ge=8, le=1_048_576)] = 1024
    #: whole examples packed into seq_len rows, attention confined to each; off: length-grouped batches
    packing: bool = True
    #: the loss computed this many labelled positions at a time, never the whole micro-batch's logits;
    #: None: the model's own loss over its full logits; "auto": the planner's choice of the two
    loss_chunk_tokens: Annotated[int, Field(ge=16, le=1_048_576)] | Auto | None = None
    gradient_checkpointing: bool | Auto = AUTO
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    weight_decay: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    #: None: what transformers picks for the model (SDPA, or eager where it has no SDPA path)
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] | None = None
    save_steps: Annotated[int, Field(ge=1, le=10_000_000)] = 200
    #: the newest checkpoints kept on disk (older ones are removed after each save); None keeps all
    save_total_limit: Annotated[int, Field(ge=1, le=10_000)] | None = 2
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 42


ZeroStage = Literal[0, 1, 2, 3]


class ResourcesSpec(_Strict):
    num_gpus: Annotated[int, Field(ge=1, le=1024)] | Auto = AUTO
    zero_stage: ZeroStage | Auto = AUTO
    offload_optimizer: OffloadDevice | Auto = AUTO
    offload_param: OffloadDevice | Auto = AUTO
    deepspeed: dict[str, Any] = Field(default_factory=dict)


#: Where a hardware figure the service fills in came from (the plan's ``hardware`` section).
FigureSource = Literal["spec", "probe", "setting", "learned", "catalogue"]


class HardwareSpec(_Strict):
    gpu_count: Annotated[int, Field(ge=1, le=1024)]
    #: None: the catalogue's figure for ``gpu_name``
    gpu_memory_bytes: Annotated[int, Field(ge=2**28, le=2**44)] | None = None
    host_memory_bytes: Annotated[int, Field(ge=2**28, le=2**50)]
    nvme_bytes: Annotated[int, Field(ge=0, le=2**56)] = 0
    gpu_name: Annotated[str, Field(max_length=128)] | None = None
    gpu_bf16_tflops: Annotated[float, Field(gt=0, le=100_000)] | None = None
    pcie_gbps: Annotated[float, Field(gt=0, le=10_000)] | None = None
    #: the card's memory bandwidth (GB/s); None: the catalogue's figure for ``gpu_name``
    gpu_memory_bandwidth_gbps: Annotated[float, Field(gt=0, le=1_000_000)] | None = None
    nvme_path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    #: Free bytes of the disk where job folders (and their checkpoints) live; None: not checked.
    #: The service fills it in for its own box.
    disk_free_bytes: Annotated[int, Field(ge=0, le=2**60)] | None = None
    #: Whether ``nvme_path`` is on the disk of the job folders: NVMe offload's swap files then take
    #: their room from the checkpoints' free space. The service fills it in for its own box.
    nvme_on_job_disk: bool = False
    #: Measured over planned step time on this box, learned from its finished jobs; multiplies every
    #: step-time figure of the plan. The service fills it in for its own box.
    step_time_factor: Annotated[float, Field(ge=0.01, le=1000)] | None = None
    #: What this box's jobs held on their GPU beyond their plans' allocated peaks, over what their plans
    #: gave that room (the allocator's cache and the memory outside PyTorch), learned from its finished
    #: jobs; scales those two terms of every plan, never the allocated figures. The service fills it in.
    gpu_memory_correction: Annotated[float, Field(ge=0.25, le=4)] | None = None
    #: This host's speed at what sets a step's host clock (Python, kernel launches, ZeRO-3's module
    #: hooks) relative to the host the step-time constants describe: a module call through two
    #: Python hooks timed on this box over HOST_HOOK_REFERENCE_US (planner.host_clock_factor).
    #: Multiplies the host clock of a micro-step. The service fills it in for its own box.
    host_clock_factor: Annotated[
        float, Field(ge=HOST_CLOCK_FACTOR_BOUNDS[0], le=HOST_CLOCK_FACTOR_BOUNDS[1])
    ] | None = None
    #: Why NVMe offload cannot run on this box (DeepSpeed's async I/O op does not build); a spec
    #: that asks for NVMe offload is then refused with this reason. The service fills it in.
    nvme_unavailable: Annotated[str, Field(min_length=1, max_length=1000)] | None = None
    #: Why QLoRA cannot run on this box (no bitsandbytes, or no CUDA for its 4-bit kernels); a
    #: QLoRA spec is then refused with this reason. The service fills it in.
    qlora_unavailable: Annotated[str, Field(min_length=1, max_length=1000)] | None = None
    #: Where each figure above came from, by field name, where it is not the spec's own (the service
    #: fills it in for its box); the plan's ``hardware`` section repeats it for every figure.
    sources: Annotated[dict[Annotated[str, Field(max_length=64)], FigureSource], Field(max_length=32)] = (
        Field(default_factory=dict))

    @model_validator(mode="after")
    def _memory_known(self) -> HardwareSpec:
        if self.gpu_memory_bytes is None and not self.gpu_name:
            raise ValueError("hardware needs gpu_memory_bytes, or a gpu_name the GPU catalogue knows")
        return self


class EvalSpec(_Strict):
    when: EvalWhen = EvalWhen.END
    every_steps: Annotated[int, Field(ge=1, le=10_000_000)] | None = None
    max_new_tokens: Annotated[int, Field(ge=0, le=32768)] = 64
    batch_size: Annotated[int, Field(ge=1, le=1024)] = 1
    num_samples: Annotated[int, Field(ge=0, le=1000)] = 4
    #: the evaluation rows, all of them; without it they are ``dataset.eval_fraction`` of the training file
    dataset: DataSource | None = None

    @model_validator(mode="after")
    def _steps_need_interval(self) -> EvalSpec:
        if self.when is EvalWhen.STEPS and self.every_steps is None:
            raise ValueError("eval.when=steps needs eval.every_steps")
        return self


class JobSpec(_Strict):
    """One fine-tuning job, as a user writes it."""

    name: Annotated[str, Field(min_length=1, max_length=200)] = "job"
    model: ModelRef
    dataset: DatasetRef | None = None
    method: Method = Method.LORA
    lora: LoraSpec = Field(default_factory=LoraSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    hardware: HardwareSpec | None = None
    eval: EvalSpec = Field(default_factory=EvalSpec)
    priority: Annotated[int, Field(ge=-100, le=100)] = 0

    @field_validator("name")
    @classmethod
    def _printable(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError("name must be printable text")
        return v

    @model_validator(mode="after")
    def _length_given(self) -> JobSpec:
        if self.training.epochs is None and self.training.max_steps is None:
            raise ValueError("training needs epochs or max_steps")
        return self

    @model_validator(mode="after")
    def _one_source_of_eval_rows(self) -> JobSpec:
        """With ``eval.dataset`` every training row trains: ``dataset.eval_fraction`` becomes 0, and
        setting both is a contradiction."""
        ds = self.dataset
        if self.eval.dataset is None or ds is None or ds.eval_fraction == 0:
            return self
        if "eval_fraction" in ds.model_fields_set:
            raise ValueError("dataset.eval_fraction and eval.dataset both choose the evaluation rows: "
                             "give one")
        self.dataset = ds.model_copy(update={"eval_fraction": 0.0})
        return self
