"""The plan: what ``tunebox plan SPEC --json`` prints and ``POST /v1/plans`` returns.

Every size is in bytes, every time in seconds.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = [
    "Alternative",
    "EvalEstimate",
    "HardwareFigure",
    "HostMemory",
    "ModelSummary",
    "Note",
    "NvmeUsage",
    "PerGpuMemory",
    "Plan",
    "PlannedHardware",
    "Resolved",
]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Note(_Out):
    code: str
    message: str
    field: str | None = None
    #: advice: the value it proposes for ``field``, and what planning that change saves per GPU
    #: (bytes of ``per_gpu.required_bytes``) and per step (seconds; negative: the step is slower)
    value: Any = None
    saves_bytes: int | None = None
    saves_seconds: float | None = None


class Resolved(_Out):
    """The configuration the worker runs: every "auto" of the spec filled."""

    method: str
    num_gpus: int
    zero_stage: int
    offload_optimizer: str
    offload_param: str
    micro_batch_size: int
    gradient_accumulation_steps: int
    global_batch_size: int
    seq_len: int
    gradient_checkpointing: bool
    precision: str
    optimizer: str
    attn_implementation: str
    #: the loss computed this many positions at a time; None: over the full logits
    loss_chunk_tokens: int | None = None


class ModelSummary(_Out):
    model_type: str
    source: str | None
    num_parameters: int
    trainable_parameters: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str | None


class PerGpuMemory(_Out):
    """Device memory of the busiest GPU. Terms are each at their own peak; ``total_bytes`` is the
    larger of the two phases (forward/backward, optimizer step) plus slack and CUDA context, or
    where larger what initialisation leaves reserved — what NVML shows for the training process
    on a card with room to spare."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int
    activations_bytes: int
    activations_checkpointed_bytes: int
    activations_full_bytes: int
    logits_bytes: int
    zero_buffers_bytes: int
    gathered_parameters_bytes: int
    optimizer_step_transient_bytes: int
    cuda_context_bytes: int
    allocator_slack_bytes: int
    forward_backward_bytes: int
    optimizer_step_bytes: int
    #: allocated at ``deepspeed.initialize``'s peak: ZeRO-1/2 flatten the trainable parameters
    #: beside the model (0 under ZeRO-0 and ZeRO-3, which do not)
    initialization_bytes: int = 0
    peak_phase: str
    total_bytes: int
    #: what must fit on each GPU: ``total_bytes`` less the blocks initialisation leaves cached,
    #: which an allocator short of memory gives back (and DeepSpeed then flattens via the host)
    required_bytes: int
    #: PyTorch's share of ``required_bytes`` on each GPU: it less ``cuda_context_bytes`` (memory
    #: outside its allocator). A job that shares its card runs with the allocator limited to this
    #: plus a tolerance, so it gives cached blocks back instead of growing past its lease.
    allocator_limit_bytes: int
    capacity_bytes: int


class HostMemory(_Out):
    """Host RAM of all training processes together (resident set): the largest of the model load,
    ZeRO-3's partition staging, and the training with its offloaded states and a checkpoint save."""

    #: the processes while they load the model
    process_bytes: int
    #: the processes once their first steps have loaded the rest of the CUDA libraries
    training_process_bytes: int
    #: what a checkpoint save holds at once: torch.save's copy of the largest GPU-resident storage
    #: of the engine on each rank, or rank 0's host copy of the weights it writes
    checkpoint_save_bytes: int
    model_load_bytes: int
    #: ZeRO-3 with the parameters on the GPU: the host buffer deepspeed.initialize flattens each
    #: rank's trainable bf16 partitions through (transient; the peak is the larger of it, the model
    #: load and the offloaded states)
    partition_staging_bytes: int
    #: the optimizer on NVMe: the moments its first step creates for the largest sub-group and
    #: the group's bf16 copy for the GPU, in host memory until it swaps them out (transient,
    #: beside the offloaded states)
    first_step_states_bytes: int
    optimizer_states_bytes: int
    master_weights_bytes: int
    gradients_bytes: int
    parameters_bytes: int
    pinned_buffers_bytes: int
    total_bytes: int
    capacity_bytes: int
    fits: bool


class NvmeUsage(_Out):
    total_bytes: int
    capacity_bytes: int
    fits: bool


class DiskUsage(_Out):
    """Checkpoints on the disk of the job folder: each as the trainer writes it (the weights, and
    DeepSpeed's engine state: model states, fp32 master and optimizer moments of what trains), times
    the most kept at once (``training.save_total_limit``, plus the one being written)."""

    checkpoint_bytes: int
    #: the most complete checkpoints on disk at once; None where the number of steps is unknown
    #: and no save_total_limit bounds them
    checkpoints_at_peak: int | None
    #: NVMe offload's swap files where they are on the same disk (``hardware.nvme_on_job_disk``)
    nvme_swap_bytes: int = 0
    total_bytes: int
    free_bytes: int | None
    fits: bool


class EvalEstimate(_Out):
    """The separate evaluation process: the model in inference plus generation's KV cache."""

    weights_bytes: int
    kv_cache_bytes: int
    activations_bytes: int
    logits_bytes: int
    cuda_context_bytes: int
    total_bytes: int
    capacity_bytes: int
    fits: bool  # on a GPU of its own
    #: beside the training's peak on the training's first GPU, where an evaluation of a checkpoint
    #: taken during training (``eval.when: steps``) runs; the job's GPU lease then holds both
    fits_beside_training: bool
    batch_size: int
    prompt_tokens: int
    max_new_tokens: int


class Alternative(_Out):
    changes: dict[str, Any]
    fits: bool
    #: ``configuration`` (the same job, run differently), ``shorter_seq_len`` or ``method_change``
    #: (a different job the user may accept: LoRA -> QLoRA, full -> LoRA or QLoRA)
    kind: str = "configuration"
    per_gpu_total_bytes: int
    #: what must fit on each GPU (``per_gpu.required_bytes`` of that configuration)
    per_gpu_required_bytes: int = 0
    host_total_bytes: int
    estimated_step_seconds: float
    estimated_tokens_per_second: float
    reason: str


class HardwareFigure(_Out):
    """One figure of the box a plan ran on, and where it came from: ``spec`` (given in the job's
    hardware), ``probe`` (measured on the box at start-up), ``setting`` (the service's settings),
    ``learned`` (from the box's finished jobs), ``catalogue`` (the card's datasheet) or ``default``
    (the planner's calibration card)."""

    value: float
    unit: str
    source: str
    detail: str | None = None


class PlannedHardware(_Out):
    """The card a plan planned for and each hardware figure it used."""

    gpu_name: str | None  # as the spec or NVML gives it
    card: str | None  # the catalogue entry it matched
    card_source: str | None  # that entry's datasheet
    gpu_count: int
    gpu_memory_bytes: HardwareFigure
    gpu_flops: HardwareFigure  # the dense tensor rate the step-time constants scale (FLOP/s)
    pcie_bytes_per_s: HardwareFigure  # the effective offload rate
    gpu_memory_bandwidth: HardwareFigure  # the memory-bound kernels' rate (bytes/s)
    host_memory_bytes: HardwareFigure
    nvme_bytes: HardwareFigure
    step_time_factor: HardwareFigure
    host_clock_factor: HardwareFigure
    #: scales the allocator's slack and the CUDA context of the plan (hardware.gpu_memory_correction)
    gpu_memory_correction: HardwareFigure


class Plan(_Out):
    fits: bool
    margin_bytes: int
    num_gpus: int
    resolved: Resolved
    model: ModelSummary
    per_gpu: PerGpuMemory
    host: HostMemory
    nvme: NvmeUsage
    disk: DiskUsage | None = None
    eval: EvalEstimate
    estimated_step_seconds: float
    estimated_tokens_per_second: float
    #: The box's measured/planned step-time ratio the speed figures include (hardware.step_time_factor).
    step_time_factor: float = 1.0
    #: This host's clock over the calibration host's that the speed figures include
    #: (hardware.host_clock_factor).
    host_clock_factor: float = 1.0
    estimated_steps: int | None
    estimated_duration_seconds: float | None
    deepspeed_config: dict[str, Any]
    hardware: PlannedHardware | None = None
    alternatives: list[Alternative]
    warnings: list[Note]
    advice: list[Note]
