"""Step time from FLOPs, the GPU's rate, host-side overheads and the bytes that must move.

Per token, a forward pass costs 2 FLOPs per weight in a matmul (LM head included, the embedding
lookup not) plus causal attention, 2·seq·q_dim per layer; backward costs twice that for full
fine-tuning and once for frozen weights (LoRA computes input gradients only); recomputation under
gradient checkpointing adds one more forward.

The other kernels (norms, rotary embeddings, activations, residual adds, dropout, LoRA's scaling
and sums, the loss over the vocabulary, eager attention's passes over its scores, the embedding's
gradient) do little arithmetic on many bytes: they run at the card's memory bandwidth. Their bytes
are counted per element they pass over (``memory_bound_elements``), at a cost per element measured
kernel by kernel as the trainer builds the model (``bench/step_kernels.py``), and timed at the
card's bandwidth beside the matmuls.

Rows that carry an attention mask (packed sequences, padding) under SDPA run its memory-efficient
kernel on k/v repeated to every head, which computes the whole square and gets through the causal
FLOPs at a fraction of the matmuls' rate: their attention is timed apart, at that kernel's measured
rate and fixed cost per call (``bench/attention_kernels.py``), and stays out of the MFU-timed FLOPs.

A micro-step takes two clocks: the GPU's (matmul FLOPs at the GPU's rate × MFU, the memory-bound
kernels' bytes at its bandwidth, masked attention at its kernel's rate) and the host's (a cost
per operation the decoder layers dispatch, ``planner/ops.py``: Python, autograd and the kernel
launch; ZeRO-3's fetch/release hooks per module, plus the all-gather/reduce-scatter
synchronisation of each module when ZeRO-3 spans several GPUs). The host queues kernels ahead of
the GPU, so the two overlap: a small model is bound by the host, a large one by its FLOPs. They
overlap imperfectly where they are close (each layer's pass is bound by one or the other, and the
host waits at every synchronisation), so the micro-step is their power mean
``(gpu^(1/q) + host^(1/q))^q`` rather than the larger: q → 0 is the larger, 1 their sum; the
collectives and offload traffic that ``overlap_comm`` runs beside the compute join the same mean. The
optimizer step adds, besides its per-parameter work, a host cost per trainable tensor (DeepSpeed's
per-parameter bookkeeping, gradient clipping's norms, the copies back to the model). Offload adds
PCIe traffic and CPU optimizer time (the gradients reach the host in the backward of the
accumulation boundary, beside its compute; the updated weights come back in the optimizer step);
ZeRO adds collectives over NVLink.

``step_terms`` reduces a configuration to the quantities the constants multiply, so
``bench/accuracy.py`` can refit and cross-validate the constants without re-planning.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner import constants as C
from planner.hardware import reference_card
from planner.memory import ModelFacts, moment_bytes_per_param, weight_bytes
from planner.ops import layer_modules, layer_ops
from planner.setup import Method, OffloadDevice, Optimizer, Precision, Setup, ZeroKnobs

__all__ = [
    "GpuRates",
    "SpeedConstants",
    "SpeedEstimate",
    "StepTerms",
    "estimate_speed",
    "adapter_bytes",
    "causal_attention_flops",
    "causal_attention_micro_flops",
    "head_dim_band",
    "memory_bound_bytes",
    "memory_bound_elements",
    "host_clock_factor",
    "overlapped",
    "step_phases",
    "step_seconds",
    "step_terms",
]


@dataclass(frozen=True, slots=True)
class GpuRates:
    flops: float = C.DEFAULT_GPU_FLOPS
    pcie_bytes_per_s: float = C.PCIE_BYTES_PER_S
    #: the card's memory bandwidth, at which the memory-bound kernels move their bytes
    memory_bytes_per_s: float = reference_card().memory_bandwidth_gbps * 1e9
    #: This box's measured over planned step time, learned from its finished jobs (1: none yet).
    #: The host clock (Python hooks, launches, the CPU optimizer) runs at the host CPU's speed,
    #: which differs from box to box; the factor scales every part of the step alike.
    step_time_factor: float = 1.0
    #: This host's hooked-module time over the calibration host's (``host_clock_factor``): the host
    #: clock of a micro-step (Python, launches, ZeRO-3's hooks) and of the optimizer's walk over the
    #: tensors, not the GPU's, scales by it to the power ``HOST_CLOCK_EXPONENT``.
    host_clock_factor: float = 1.0


def host_clock_factor(hooked_module_us: float) -> float:
    """A host's clock relative to the host the step-time constants describe, from the time of one
    small module call through two Python hooks (a forward pre-hook and a forward hook) on the
    training device: what ZeRO-3 and transformers add to every module of every pass."""
    if hooked_module_us <= 0:
        raise ValueError("hooked_module_us must be positive")
    low, high = C.HOST_CLOCK_FACTOR_BOUNDS
    return round(min(high, max(low, hooked_module_us / C.HOST_HOOK_REFERENCE_US)), 4)


@dataclass(frozen=True, slots=True)
class SpeedEstimate:
    step_seconds: float
    tokens_per_second: float  # all GPUs together
    compute_seconds: float  # GPU math (or the host, where it is slower) per step
    communication_seconds: float  # collectives per step
    offload_seconds: float  # PCIe, CPU optimizer and NVMe per step
    flops_per_step: float  # per GPU


@dataclass(frozen=True, slots=True)
class SpeedConstants:
    """The fitted step-time constants (planner/constants.py holds the values in use)."""

    mfu: float = C.MFU
    layer_op_s: float = C.LAYER_OP_SECONDS
    zero3_fetch_pass_s: float = C.ZERO3_FETCH_PASS_OVERHEAD_S
    zero3_hook_pass_s: float = C.ZERO3_HOOK_PASS_OVERHEAD_S
    zero3_collective_pass_s: float = C.ZERO3_COLLECTIVE_PASS_OVERHEAD_S
    gpu_optimizer_s_per_param: float = C.GPU_OPTIMIZER_SECONDS_PER_PARAM
    cpu_optimizer_s_per_param_zero3: float = C.CPU_OPTIMIZER_SECONDS_PER_PARAM_ZERO3
    cpu_optimizer_s_per_param_zero12: float = C.CPU_OPTIMIZER_SECONDS_PER_PARAM_ZERO12
    clock_overlap: float = C.CLOCK_OVERLAP
    step_tensor_s: float = C.OPTIMIZER_STEP_TENSOR_SECONDS
    host_clock_exponent: float = C.HOST_CLOCK_EXPONENT
    clock_overlap_zero12: float = C.CLOCK_OVERLAP_ZERO12
    #: measured, not fitted: a 4-bit linear's host time per forward and per backward pass
    qlora_forward_s: float = C.QLORA_LINEAR_FORWARD_HOST_S
    qlora_backward_s: float = C.QLORA_LINEAR_BACKWARD_HOST_S


@dataclass(frozen=True, slots=True)
class StepTerms:
    """One configuration's step as the quantities the constants multiply."""

    accumulation: int
    gpu_seconds_at_full_rate: float  # one micro-step's FLOPs at 100% of the GPU's rate
    masked_attention_seconds: float  # its masked SDPA calls at their kernel's measured rate (0: causal)
    memory_bound_seconds: float  # its memory-bound kernels' bytes at the card's bandwidth
    layer_ops: int  # operations the decoder layers dispatch in one micro-step (planner/ops.py)
    quantized_forwards: int  # 4-bit linears' forward calls in one micro-step (QLoRA; 0 otherwise)
    quantized_backwards: int  # and their backward calls
    zero3_fetch_passes: int  # modules whose parameters ZeRO-3 gathers × passes (0 without ZeRO-3)
    zero3_hook_passes: int  # the other modules ZeRO-3 hooks × passes (0 without ZeRO-3)
    zero3_collective_passes: int  # the gathering passes, when ZeRO-3 spans several GPUs
    micro_comm_seconds: float  # collectives of one micro-step
    micro_offload_seconds: float  # PCIe/NVMe traffic of a micro-step before the accumulation boundary
    boundary_offload_seconds: float  # PCIe/NVMe traffic of the boundary micro-step (gradients to the host)
    overlap: bool  # collectives and offload traffic run beside the compute (their power mean)
    zero12: bool  # ZeRO-1/2 with overlap_comm: the engine synchronises host and GPU in every backward
    gpu_optimizer_params: float  # parameters one GPU updates on the GPU
    trainable_tensors: int  # parameter tensors the optimizer step walks, LoRA's A and B each one
    cpu_optimizer_params: float  # parameters all ranks update on the host's CPUs (they share its cores)
    cpu_optimizer_zero3: bool  # that CPU step casts each updated sub-group onto the GPU (ZeRO-3's weights)
    step_offload_seconds: float  # PCIe and NVMe traffic of the optimizer step (updated weights back)
    step_comm_seconds: float  # collectives at the accumulation boundary
    flops_per_micro: float  # per GPU
    tokens_per_step: int  # all GPUs together
    host_clock_factor: float  # this host's clock over the calibration host's


def _flops_per_token(facts: ModelFacts, s: Setup) -> tuple[float, float]:
    return _flops(facts, s.seq_len, s.attn_implementation, s.method)


def causal_attention_flops(facts: ModelFacts, seq_len: int) -> float:
    """One layer's causal attention forward per token: half of QK^T and AV."""
    return 2.0 * seq_len * facts.arch.q_dim


@lru_cache(maxsize=1024)
def _flops(facts: ModelFacts, seq_len: int, attn_implementation: str, method: str) -> tuple[float, float]:
    """(forward, backward) FLOPs per token of one GPU's micro-batch."""
    arch = facts.arch
    attn = causal_attention_flops(facts, seq_len) * arch.num_layers
    if attn_implementation == "eager":
        attn *= 2  # the masked half is computed too
    matmul = 2.0 * arch.matmul_params
    lora = 2.0 * facts.trainable_parameters if method != "full" else 0.0
    forward = matmul + attn + lora
    backward = 2 * matmul + 2 * attn + 2 * lora if method == "full" else matmul + 2 * attn + 2 * lora
    return forward, backward


def _mfu_scale(facts: ModelFacts, s: Setup) -> float:
    # A matmul is as efficient as its smallest dimension allows: few tokens per micro-batch or a
    # narrow model leave the tensor cores waiting on memory.
    dim = min(s.tokens_per_micro_batch, facts.arch.hidden_size)
    return dim / (dim + C.MATMUL_HALF_EFFICIENCY_DIM) if dim > 0 else 1.0


#: head dimensions the masked kernel's rate is measured for: up to 128 (most families) and above (Gemma)
HEAD_DIM_BANDS = (128, 256)


def head_dim_band(head_dim: int) -> int:
    return HEAD_DIM_BANDS[0] if head_dim <= HEAD_DIM_BANDS[0] else HEAD_DIM_BANDS[1]


def _masked_attention(s: Setup) -> bool:
    return s.attention_mask and s.attn_implementation == "sdpa"


def _masked_attention_seconds(facts: ModelFacts, s: Setup, rates: GpuRates) -> float:
    """GPU time of one micro-step's masked SDPA calls: per layer a fixed cost plus the causal FLOPs of
    forward and backward (three forwards') at the kernel's rate, and the forward again under
    checkpointing."""
    if not _masked_attention(s):
        return 0.0
    arch = facts.arch
    narrow = head_dim_band(arch.head_dim) == HEAD_DIM_BANDS[0]
    fraction = C.MASKED_ATTENTION_RATE if narrow else C.MASKED_ATTENTION_RATE_WIDE_HEADS
    forward = causal_attention_flops(facts, s.seq_len) * s.tokens_per_micro_batch  # in one layer
    call = C.MASKED_ATTENTION_CALL_SECONDS + 3 * forward / (fraction * rates.flops)
    recompute = 1 + (C.MASKED_ATTENTION_FORWARD_SHARE if s.gradient_checkpointing else 0.0)
    return arch.num_layers * call * recompute


def _norm_elements(facts: ModelFacts) -> int:
    """Elements one token's pass through a decoder layer's norms covers: the hidden state for each
    hidden-sized norm, the queries and keys for per-head q/k norms (Qwen3)."""
    arch = facts.arch
    hidden = sum(1 for n in arch.norm_sizes if n == arch.hidden_size)
    heads = arch.q_dim + arch.kv_dim if len(arch.norm_sizes) > hidden else 0
    return hidden * arch.hidden_size + heads


#: A LoRA adapter's bytes per element of its input and of its output (bf16: 2 bytes), counted from its
#: kernels. Forward: on the input, dropout reads it and writes it and a one-byte mask (5); on the
#: output, the scaling reads and writes (4) and the sum reads two and writes one (6). Backward: on
#: the input, dropout's reads the gradient and the mask and writes (5) and the input's two gradients
#: are summed (6); on the output, the scaling's reads and writes (4).
ADAPTER_FORWARD_BYTES = (5, 10)
ADAPTER_BACKWARD_BYTES = (11, 4)


def _per_adapter_token(facts: ModelFacts, per: tuple[int, int]) -> int:
    if facts.lora is None:
        return 0
    return sum(per[0] * lin.in_features + per[1] * lin.out_features for lin in facts.lora.layer_linears)


def adapter_bytes(facts: ModelFacts, s: Setup) -> float:
    """Bytes one micro-step's LoRA adapters move outside their matmuls: each forward (twice under
    checkpointing) and the backward, every layer, every token."""
    tokens, layers = s.tokens_per_micro_batch, facts.arch.num_layers
    return tokens * layers * (s.forwards * _per_adapter_token(facts, ADAPTER_FORWARD_BYTES)
                              + _per_adapter_token(facts, ADAPTER_BACKWARD_BYTES))


def memory_bound_elements(facts: ModelFacts, s: Setup) -> dict[str, float]:
    """What one micro-step's memory-bound kernels pass over, per ``MEMORY_BYTES_*`` constant: a
    decoder layer's hidden state in each forward (twice under checkpointing) and in the backward,
    its norms' elements in each forward, eager attention's scores (heads × sequence per token) in
    each forward and the backward, the logits (soft-capped ones again), and, when the embedding
    trains, its gradient once. LoRA's adapters are counted in bytes (``adapter_bytes``)."""
    arch = facts.arch
    tokens, layers = s.tokens_per_micro_batch, arch.num_layers
    forward_tokens = s.forwards * tokens * layers  # a token's passes through a layer's forward
    scores = arch.num_heads * s.seq_len if s.attn_implementation == "eager" else 0
    vocabulary = tokens * arch.vocab_size
    return {
        "layer_forward": forward_tokens * arch.hidden_size,
        "layer_backward": tokens * layers * arch.hidden_size,
        "norm_forward": forward_tokens * _norm_elements(facts),
        "scores_forward": forward_tokens * scores,
        "scores_backward": tokens * layers * scores,
        "logits": vocabulary,
        "logit_softcap": vocabulary if arch.final_logit_softcapping is not None else 0,
        "embedding_gradient": arch.embedding_params if s.method == "full" else 0,
    }


def _bytes_per_element(kind: str) -> float:
    value: float = getattr(C, f"MEMORY_BYTES_{kind.upper()}")
    return value


def memory_bound_bytes(facts: ModelFacts, s: Setup) -> float:
    """Bytes one micro-step's memory-bound kernels move: each kind's elements at its measured cost
    (``MEMORY_BYTES_*``: bytes at the card's datasheet bandwidth), and the adapters' bytes."""
    counted = sum(_bytes_per_element(k) * n for k, n in memory_bound_elements(facts, s).items())
    return counted + adapter_bytes(facts, s)


def causal_attention_micro_flops(facts: ModelFacts, s: Setup) -> float:
    """One micro-step's causal attention FLOPs: its forwards and a backward of twice a forward's,
    every layer and token."""
    return (causal_attention_flops(facts, s.seq_len) * facts.arch.num_layers * (s.forwards + 2)
            * s.tokens_per_micro_batch)


def _gpu_seconds(facts: ModelFacts, s: Setup, rates: GpuRates) -> tuple[float, float]:
    """(seconds at 100% of the rate, FLOPs) of one micro-step; masked attention's FLOPs are counted
    but not timed here (``_masked_attention_seconds``)."""
    fwd, bwd = _flops_per_token(facts, s)
    flops = (fwd * s.forwards + bwd) * s.tokens_per_micro_batch
    if s.loss_chunk_tokens is not None:
        # each chunk of the loss is checkpointed: the backward runs the LM head's forward again
        flops += 2.0 * facts.arch.vocab_size * facts.arch.hidden_size * s.tokens_per_micro_batch
    timed = flops
    if _masked_attention(s):
        timed -= causal_attention_micro_flops(facts, s)
    if s.method == "qlora":
        # the decoder layers' 4-bit weights: every forward and the input's gradient multiply by a
        # freshly dequantized copy, more slowly than by a stored bf16 weight
        arch = facts.arch
        quantized = 2.0 * arch.num_layers * arch.layer_linear_params * s.passes * s.tokens_per_micro_batch
        timed += (C.QLORA_MATMUL_SLOWDOWN - 1) * quantized
    return timed / (rates.flops * _mfu_scale(facts, s)), flops


@lru_cache(maxsize=256)
def _modules_per_layer(facts: ModelFacts, persistence_threshold: int) -> tuple[int, int]:
    """(gathering, other) nn.Modules of one decoder layer that ZeRO-3 hooks: all it runs
    (``planner/ops.py``'s ``layer_modules``). Only a module holding a parameter above
    ``stage3_param_persistence_threshold`` waits for an all-gather; the others (norms, small
    adapters) stay whole on every GPU and cost only the hook.
    """
    arch = facts.arch
    gathering = sum(1 for lin in arch.linears if lin.in_features * lin.out_features > persistence_threshold)
    if facts.lora:
        r = facts.lora.r
        gathering += sum(
            (r * lin.in_features > persistence_threshold) + (r * lin.out_features > persistence_threshold)
            for lin in facts.lora.layer_linears
        )
    return gathering, layer_modules(arch, facts.lora) - gathering


def _micro_comm(facts: ModelFacts, s: Setup, w: int) -> float:
    n = s.num_gpus
    if n == 1:
        return 0.0
    ring = (n - 1) / n
    t, p = facts.trainable_parameters, facts.total_parameters
    if s.zero_stage == 3:
        # all-gather of the weights in every pass, reduce-scatter of the gradients
        return (s.passes * w * p + w * t) * ring / C.NVLINK_BYTES_PER_S
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


def _offload(facts: ModelFacts, s: Setup, rates: GpuRates, w: int) -> tuple[float, float, float]:
    """(a micro-step before the accumulation boundary, the boundary micro-step, the optimizer step)
    seconds of offload traffic, CPU work excluded.

    With the optimizer offloaded, DeepSpeed moves each gradient to the host from its backward hook
    at the accumulation boundary, beside the compute, into the fp32 partition (4 bytes a parameter,
    upcast on the GPU). Before the boundary ZeRO-3 accumulates the partitions on the GPU, and so does
    ZeRO-1 (its gradients stay in ``.grad`` until the boundary reduces them, once). ZeRO-2 reduces
    every micro-step's gradients into a bf16 host buffer per parameter: the first micro-step sends
    them down, each later one, the boundary's included, brings the buffer back, adds and sends it
    down again. The optimizer step then only sends the updated bf16 weights back, unless the
    parameters live on the host too."""
    n = s.num_gpus
    part = facts.trainable_parameters / (1 if s.zero_stage == 0 else n)
    ga = s.gradient_accumulation_steps
    micro = boundary = step = 0.0
    if s.offload_optimizer != "none":
        accumulating = s.host_accumulation_buffer
        if accumulating:  # the mean of the micro-steps before the boundary
            micro = (2 * ga - 3) / (ga - 1) * w * part / rates.pcie_bytes_per_s
        boundary = ((2 * w * part if accumulating else 0.0) + _FP32 * part) / rates.pcie_bytes_per_s
        if not (s.zero_stage == 3 and s.offload_param != "none"):
            step = w * part / rates.pcie_bytes_per_s  # updated weights up
        if s.offload_optimizer == "nvme":
            step += 2 * (_FP32_STATE + moment_bytes_per_param(s.optimizer)) * part / C.NVME_BYTES_PER_S
    if s.zero_stage == 3 and s.offload_param != "none":
        moved = s.passes * w * facts.total_parameters / n
        params = moved / rates.pcie_bytes_per_s
        if s.offload_param == "nvme":
            params += moved / C.NVME_BYTES_PER_S
        micro += params
        boundary += params
    return micro, boundary, step


_FP32 = 4
_FP32_STATE = 8  # fp32 master + fp32 gradient per parameter, swapped with the moments


@lru_cache(maxsize=1024)
def _trainable_tensors(facts: ModelFacts) -> int:
    return sum(t.copies for t in facts.tensors if t.trainable)


def _micro_gpu(facts: ModelFacts, s: Setup, rates: GpuRates) -> tuple[float, float, float, float]:
    """(GPU seconds at full rate, FLOPs, masked attention seconds, memory-bound bytes) of ``s``'s
    micro-step, memoised per micro-step shape: the fields of ``s`` they read (a search scores many
    points of one shape)."""
    return _shape_gpu(facts, rates, s.method, s.micro_batch_size, s.seq_len, s.gradient_checkpointing,
                      s.loss_chunk_tokens, s.attn_implementation, s.attention_mask)


@lru_cache(maxsize=4096)
def _shape_gpu(facts: ModelFacts, rates: GpuRates, method: Method, micro: int, seq_len: int,
               checkpointing: bool, chunk: int | None, attn_implementation: str, attention_mask: bool
               ) -> tuple[float, float, float, float]:
    none = OffloadDevice.NONE
    shape = Setup(method, 1, 0, none, none, micro, 1, seq_len, checkpointing, Precision.BF16, Optimizer.ADAMW,
                  attn_implementation, ZeroKnobs(), chunk, attention_mask)
    gpu, flops = _gpu_seconds(facts, shape, rates)
    return gpu, flops, _masked_attention_seconds(facts, shape, rates), memory_bound_bytes(facts, shape)


def step_terms(facts: ModelFacts, s: Setup, rates: GpuRates) -> StepTerms:
    w = weight_bytes(s.precision)
    gpu, flops, masked, memory_bound = _micro_gpu(facts, s, rates)
    layer_passes = s.passes * facts.arch.num_layers
    ops = layer_ops(facts.arch, s.method, facts.lora, s.attn_implementation)
    quantized = len(facts.arch.linears) * facts.arch.num_layers if s.method == "qlora" else 0
    gathering, other = _modules_per_layer(facts, int(s.knobs.param_persistence_threshold))
    fetch_passes = layer_passes * gathering if s.zero_stage == 3 else 0
    hook_passes = layer_passes * other if s.zero_stage == 3 else 0
    off_micro, off_boundary, off_step = _offload(facts, s, rates, w)
    part = facts.trainable_parameters / (1 if s.zero_stage == 0 else s.num_gpus)
    on_cpu = s.offload_optimizer != "none"
    return StepTerms(
        accumulation=s.gradient_accumulation_steps,
        gpu_seconds_at_full_rate=gpu,
        masked_attention_seconds=masked,
        memory_bound_seconds=memory_bound / rates.memory_bytes_per_s,
        layer_ops=facts.arch.num_layers * ops.per_micro_step(s.gradient_checkpointing),
        quantized_forwards=quantized * (s.passes - 1),
        quantized_backwards=quantized,
        zero3_fetch_passes=fetch_passes,
        zero3_hook_passes=hook_passes,
        zero3_collective_passes=fetch_passes if s.num_gpus > 1 else 0,
        micro_comm_seconds=_micro_comm(facts, s, w),
        micro_offload_seconds=off_micro,
        boundary_offload_seconds=off_boundary,
        overlap=s.knobs.overlap_comm,
        zero12=s.zero_stage in (1, 2) and s.knobs.overlap_comm,
        gpu_optimizer_params=0.0 if on_cpu else part,
        trainable_tensors=_trainable_tensors(facts),
        # every rank's DeepSpeedCPUAdam runs OpenMP threads over the same cores: the host's CPU step
        # takes as long as updating all ranks' partitions at the host's rate
        cpu_optimizer_params=facts.trainable_parameters if on_cpu else 0.0,
        cpu_optimizer_zero3=s.zero_stage == 3 and s.offload_param == "none",
        step_offload_seconds=off_step,
        step_comm_seconds=_step_comm(facts, s, w),
        flops_per_micro=flops,
        tokens_per_step=s.tokens_per_micro_batch * s.gradient_accumulation_steps * s.num_gpus,
        host_clock_factor=rates.host_clock_factor,
    )


def overlapped(q: float, *seconds: float) -> float:
    """What work running side by side takes: the power mean ``(sum of t^(1/q))^q`` of the times,
    the longest as q → 0, their sum at q = 1 (computed on their ratios to the longest, so a small
    q cannot overflow)."""
    top = max(seconds)
    if top <= 0 or q <= 0:
        return top
    mean: float = sum((t / top) ** (1 / q) for t in seconds) ** q
    return top * mean


def _parts(t: StepTerms, k: SpeedConstants) -> tuple[float, float, float]:
    """(compute per micro-step, optimizer per step (the GPU's update and the host's walk over the
    trainable tensors), CPU optimizer per step) seconds."""
    hf = t.host_clock_factor**k.host_clock_exponent
    host = hf * (
        t.layer_ops * k.layer_op_s
        + t.zero3_fetch_passes * k.zero3_fetch_pass_s
        + t.zero3_hook_passes * k.zero3_hook_pass_s
        + t.zero3_collective_passes * k.zero3_collective_pass_s
        + t.quantized_forwards * k.qlora_forward_s
        + t.quantized_backwards * k.qlora_backward_s
    )
    q = k.clock_overlap_zero12 if t.zero12 else k.clock_overlap
    gpu = t.gpu_seconds_at_full_rate / k.mfu + t.masked_attention_seconds + t.memory_bound_seconds
    compute = overlapped(q, gpu, host)
    cpu_rate = (
        k.cpu_optimizer_s_per_param_zero3 if t.cpu_optimizer_zero3 else k.cpu_optimizer_s_per_param_zero12
    )
    optimizer = (
        t.gpu_optimizer_params * k.gpu_optimizer_s_per_param
        + hf * t.trainable_tensors * k.step_tensor_s
    )
    return compute, optimizer, t.cpu_optimizer_params * cpu_rate


def step_phases(t: StepTerms, k: SpeedConstants) -> tuple[float, float]:
    """(forward and backward of all micro-steps, the optimizer step) seconds: the two phases
    ``bench/measure.py`` times apart (``measured.phase_seconds``)."""
    return _phases(t, k, _parts(t, k))


def _phases(t: StepTerms, k: SpeedConstants, parts: tuple[float, float, float]) -> tuple[float, float]:
    compute, gpu_opt, cpu_opt = parts
    c = t.micro_comm_seconds

    def micro(offload: float) -> float:
        return overlapped(k.clock_overlap, compute, c, offload) if t.overlap else compute + c + offload

    passes = micro(t.boundary_offload_seconds)
    if t.accumulation > 1:
        passes += (t.accumulation - 1) * micro(t.micro_offload_seconds)
    return passes, gpu_opt + cpu_opt + t.step_offload_seconds + t.step_comm_seconds


def step_seconds(t: StepTerms, k: SpeedConstants) -> float:
    return sum(step_phases(t, k))


#: The constants in use; bench/accuracy.py passes its own to ``step_seconds`` when it refits.
_CONSTANTS = SpeedConstants()


def estimate_speed(facts: ModelFacts, s: Setup, rates: GpuRates) -> SpeedEstimate:
    t = step_terms(facts, s, rates)
    k = _CONSTANTS
    parts = _parts(t, k)
    compute, _, cpu_opt = parts
    f = rates.step_time_factor
    step = f * sum(_phases(t, k, parts))
    accum = t.accumulation
    traffic = (accum - 1) * t.micro_offload_seconds + t.boundary_offload_seconds + t.step_offload_seconds
    return SpeedEstimate(
        step_seconds=step,
        tokens_per_second=t.tokens_per_step / step,
        compute_seconds=f * accum * compute,
        communication_seconds=f * (accum * t.micro_comm_seconds + t.step_comm_seconds),
        offload_seconds=f * (traffic + cpu_opt),
        flops_per_step=t.flops_per_micro * accum,
    )
