"""Step time from FLOPs, the GPU's rate, host-side overheads and the bytes that must move.

Per token, a forward pass costs 2 FLOPs per weight in a matmul (LM head included, the embedding
lookup not) plus causal attention, 2·seq·q_dim per layer; backward costs twice that for full
fine-tuning and once for frozen weights (LoRA computes input gradients only); recomputation under
gradient checkpointing adds one more forward. Offload adds PCIe traffic and CPU optimizer time;
ZeRO adds collectives over NVLink, overlapped with compute when ``overlap_comm`` is on.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner import constants as C
from planner.memory import ModelFacts, moment_bytes_per_param, weight_bytes
from planner.setup import Setup

__all__ = ["GpuRates", "SpeedEstimate", "estimate_speed"]


@dataclass(frozen=True, slots=True)
class GpuRates:
    flops: float = C.DEFAULT_GPU_FLOPS
    pcie_bytes_per_s: float = C.PCIE_BYTES_PER_S


@dataclass(frozen=True, slots=True)
class SpeedEstimate:
    step_seconds: float
    tokens_per_second: float  # all GPUs together
    compute_seconds: float  # GPU math per step
    communication_seconds: float  # collectives per step
    offload_seconds: float  # PCIe, CPU optimizer and NVMe per step
    flops_per_step: float  # per GPU


def _flops_per_token(facts: ModelFacts, s: Setup) -> tuple[float, float]:
    return _flops(facts, s.seq_len, s.attn_implementation, s.method)


@lru_cache(maxsize=1024)
def _flops(facts: ModelFacts, seq_len: int, attn_implementation: str, method: str) -> tuple[float, float]:
    """(forward, backward) FLOPs per token of one GPU's micro-batch."""
    arch = facts.arch
    attn = 2.0 * seq_len * arch.q_dim * arch.num_layers  # causal: half of QK^T and AV
    if attn_implementation == "eager":
        attn *= 2  # the masked half is computed too
    matmul = 2.0 * arch.matmul_params
    lora = 2.0 * facts.trainable_parameters if method != "full" else 0.0
    forward = matmul + attn + lora
    backward = 2 * matmul + 2 * attn + 2 * lora if method == "full" else matmul + 2 * attn + 2 * lora
    return forward, backward


def _mfu(facts: ModelFacts, s: Setup) -> float:
    # A matmul is as efficient as its smallest dimension allows: few tokens per micro-batch or a
    # narrow model leave the tensor cores waiting on memory.
    dim = min(s.tokens_per_micro_batch, facts.arch.hidden_size)
    return C.MFU * dim / (dim + C.MATMUL_HALF_EFFICIENCY_DIM) if dim > 0 else C.MFU


def _micro_compute(facts: ModelFacts, s: Setup, rates: GpuRates) -> tuple[float, float]:
    fwd, bwd = _flops_per_token(facts, s)
    passes = 3 if s.gradient_checkpointing else 2
    flops = (fwd * (2 if s.gradient_checkpointing else 1) + bwd) * s.tokens_per_micro_batch
    slowdown = 1.0
    if s.method == "qlora":
        matmul_share = 2.0 * facts.arch.matmul_params / fwd
        slowdown = 1 + (C.QLORA_MATMUL_SLOWDOWN - 1) * matmul_share
    seconds = flops * slowdown / (rates.flops * _mfu(facts, s))
    # Measured on the H200 these host-side costs add to the GPU time rather than hide behind it.
    launch = passes * facts.arch.num_layers * C.LAYER_PASS_OVERHEAD_S
    hooks = 0.0
    if s.zero_stage == 3:
        hooks = passes * facts.arch.num_layers * _modules_per_layer(facts) * C.ZERO3_MODULE_PASS_OVERHEAD_S
    return seconds + launch + hooks, flops


def _modules_per_layer(facts: ModelFacts) -> int:
    """nn.Modules of one decoder layer that ZeRO-3 hooks: its linears, the layer, attention, MLP,
    activation and two norms; peft adds six per adapted linear (lora_A/lora_B/lora_dropout
    ModuleDicts and the modules inside them)."""
    adapted = len(facts.lora.layer_linears) if facts.lora else 0
    return len(facts.arch.linears) + 6 + 6 * adapted


def _micro_comm(facts: ModelFacts, s: Setup, w: int) -> float:
    n = s.num_gpus
    if n == 1:
        return 0.0
    ring = (n - 1) / n
    t, p = facts.trainable_parameters, facts.total_parameters
    passes = 3 if s.gradient_checkpointing else 2
    if s.zero_stage == 3:
        return (passes * w * p + w * t) * ring / C.NVLINK_BYTES_PER_S
    if s.zero_stage == 2:
        return w * t * ring / C.NVLINK_BYTES_PER_S  # reduce-scatter every micro-step
    return 0.0


def _step_comm(facts: ModelFacts, s: Setup, w: int) -> float:
    n = s.num_gpus
    if n == 1 or s.zero_stage == 3:
        return 0.0
    ring = (n - 1) / n
    t = facts.trainable_parameters
    if s.zero_stage in (0, 1):
        return 2 * w * t * ring / C.NVLINK_BYTES_PER_S  # all-reduce at the boundary
    return w * t * ring / C.NVLINK_BYTES_PER_S  # all-gather updated partitions


def _offload(facts: ModelFacts, s: Setup, rates: GpuRates, w: int) -> tuple[float, float]:
    """(per micro-step, per optimizer step) seconds of offload traffic and CPU work."""
    n = s.num_gpus
    part = facts.trainable_parameters / (1 if s.zero_stage == 0 else n)
    micro = step = 0.0
    if s.offload_optimizer != "none":
        step += part / C.CPU_OPTIMIZER_PARAMS_PER_S
        step += 2 * w * part / rates.pcie_bytes_per_s  # gradients down, updated weights up
        if s.zero_stage < 3 and s.gradient_accumulation_steps > 1:
            micro += 2 * w * part / rates.pcie_bytes_per_s  # accumulate on the host through the GPU
        if s.offload_optimizer == "nvme":
            step += 2 * (_FP32_STATE + moment_bytes_per_param(s.optimizer)) * part / C.NVME_BYTES_PER_S
    if s.zero_stage == 3 and s.offload_param != "none":
        passes = 3 if s.gradient_checkpointing else 2
        moved = passes * w * facts.total_parameters / n
        micro += moved / rates.pcie_bytes_per_s
        if s.offload_param == "nvme":
            micro += moved / C.NVME_BYTES_PER_S
    return micro, step


_FP32_STATE = 8  # fp32 master + fp32 gradient per parameter, swapped with the moments


def estimate_speed(facts: ModelFacts, s: Setup, rates: GpuRates) -> SpeedEstimate:
    w = weight_bytes(s.precision)
    compute, flops = _micro_compute(facts, s, rates)
    comm = _micro_comm(facts, s, w)
    off_micro, off_step = _offload(facts, s, rates, w)
    overlapped = s.knobs.overlap_comm
    micro = max(compute, comm, off_micro) if overlapped else compute + comm + off_micro
    gpu_optimizer = 0.0
    if s.offload_optimizer == "none":
        part = facts.trainable_parameters / (1 if s.zero_stage == 0 else s.num_gpus)
        gpu_optimizer = (16 + 2 * moment_bytes_per_param(s.optimizer)) * part / C.HBM_BYTES_PER_S
    step_comm = _step_comm(facts, s, w)
    accum = s.gradient_accumulation_steps
    step = accum * micro + gpu_optimizer + off_step + step_comm
    tokens = s.tokens_per_micro_batch * accum * s.num_gpus
    return SpeedEstimate(
        step_seconds=step,
        tokens_per_second=tokens / step,
        compute_seconds=accum * compute,
        communication_seconds=accum * comm + step_comm,
        offload_seconds=accum * off_micro + off_step,
        flops_per_step=flops * accum,
    )
