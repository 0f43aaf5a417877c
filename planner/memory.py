"""GPU, host and NVMe memory of one training step, as DeepSpeed 0.19 lays the states out.

Model states (per trainable parameter, mixed precision, T trainable, N GPUs):

* stage 0 (bf16 → DeepSpeed's FP16_Optimizer in bf16): bf16 params and grads, fp32 master and
  moments, all unpartitioned; fp32 gradients are flattened for the step.
* stage 1/2 (``DeepSpeedZeroOptimizer``): bf16 params flat and whole; fp32 master and moments
  partitioned; stage 1 keeps whole bf16 grads, stage 2 a bf16 partition (``grads_in_partition``);
  ``contiguous_gradients`` allocates one ``reduce_bucket_size`` bf16 ipg buffer, two with
  ``overlap_comm``, for every backward (freed by the reduction's epilogue: every backward under
  stage 2, only at the accumulation boundary under stage 1); the step flattens the partition and
  upcasts it to fp32.
* stage 3 (``DeepSpeedZeroOptimizer_Stage3``): bf16 param partitions, a bf16 gradient partition
  buffer, a persistent fp32 gradient buffer of the largest sub-group, fp32 master and moments, one
  ipg bucket; parameters of at most ``stage3_param_persistence_threshold`` elements stay whole on
  every GPU; gathered parameters follow ``stage3_max_reuse_distance``, the prefetch bucket and
  ``stage3_max_live_parameters`` (simulated over the module trace, see ``_gathered_bytes``).

Offload moves master, moments and fp32 grads (optimizer) or the bf16 partitions (params) to the
host. The gradients (and, for ZeRO-1/2, the master and a bf16 copy of it) are pinned, and torch's
pinned-memory allocator rounds every block up to a power of two; ZeRO-3's fp32 master and the
moments are plain allocations.
With the optimizer offloaded, each gradient's norm is taken on the GPU in fp64 before its copy
to the host.
The device peak is the larger of two phases — forward/backward and the optimizer step — plus
the allocator's slack and the CUDA context, which NVML counts and torch does not.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from planner import constants as C
from planner import reduction
from planner.activations import ActivationEstimate, estimate_activations
from planner.arch import Arch
from planner.lora import LoraTargets
from planner.setup import Method, OffloadDevice, Optimizer, Precision, Setup, ZeroKnobs

__all__ = [
    "HostEstimate",
    "MemoryEstimate",
    "ModelFacts",
    "NF4_BYTES_PER_PARAM",
    "estimate_memory",
    "moment_bytes_per_param",
    "weight_bytes",
]

#: NF4 with double quantisation: 4 bits, one 8-bit absmax per 64-block, one fp32 per 256 blocks.
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
_FP32 = 4
_FP64 = 8


@dataclass(frozen=True, slots=True)
class Tensor:
    numel: int
    elem_bytes: float
    trainable: bool
    copies: int  # how many such tensors the model holds (one per layer, or one)


@dataclass(frozen=True, slots=True, eq=False)
class ModelFacts:
    """The model as the estimators need it: architecture, adapters and tensors.

    Compared and hashed by identity, so per-model results can be memoised cheaply.
    """

    arch: Arch
    lora: LoraTargets | None
    tensors: tuple[Tensor, ...]
    layer_tensors: tuple[Tensor, ...]
    num_parameters: int  # base model
    trainable_parameters: int
    #: the largest weight file of the checkpoint the run loads (None: not known, see ``_shard_bytes``)
    checkpoint_shard_bytes: int | None = None

    @property
    def total_parameters(self) -> int:
        return self.num_parameters + (self.lora.trainable_parameters if self.lora else 0)


@dataclass(frozen=True, slots=True)
class HostEstimate:
    process_bytes: int
    training_process_bytes: int
    checkpoint_save_bytes: int
    model_load_bytes: int
    partition_staging_bytes: int
    first_step_states_bytes: int
    optimizer_states_bytes: int
    master_weights_bytes: int
    gradients_bytes: int
    parameters_bytes: int
    pinned_buffers_bytes: int
    total_bytes: int


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weights_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int
    activations: ActivationEstimate
    zero_buffers_bytes: int
    gathered_parameters_bytes: int
    optimizer_step_transient_bytes: int
    cuda_context_bytes: int
    allocator_slack_bytes: int
    forward_backward_bytes: int  # allocated at the forward/backward peak
    optimizer_step_bytes: int  # allocated at the optimizer-step peak
    total_bytes: int  # what NVML shows for the busiest GPU on a card with room to spare
    host: HostEstimate
    nvme_bytes: int
    initialization_bytes: int  # allocated at deepspeed.initialize's peak
    #: the blocks initialisation leaves in the allocator's cache, which NVML counts while they last
    initialization_reserved_bytes: int
    #: what must fit: ``total_bytes`` less the cached blocks an allocator under pressure gives back
    required_bytes: int

    @property
    def peak_phase(self) -> str:
        steady = max(self.forward_backward_bytes, self.optimizer_step_bytes) + self.allocator_slack_bytes
        floor = self.total_bytes - self.cuda_context_bytes
        if floor > steady:  # what initialisation leaves reserved, or ZeRO-1's step beside its freed grads
            return "initialization" if self.initialization_reserved_bytes >= floor else "optimizer_step"
        return (
            "forward_backward"
            if self.forward_backward_bytes >= self.optimizer_step_bytes
            else "optimizer_step"
        )


def weight_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def moment_bytes_per_param(optimizer: str) -> float:
    """Optimizer state besides the fp32 master copy, per trainable parameter."""
    if optimizer == "adamw":
        return 8.0
    if optimizer == "adamw_8bit":  # two uint8 states + fp32 absmax per 2048-block
        return 2.0 + 2 * 4 / 2048
    return 4.0  # lion: one momentum; sgd: one momentum buffer


def _moment_tensors(optimizer: str) -> int:
    """How many state tensors the optimizer keeps per parameter tensor: AdamW's two moments, one
    momentum for Lion and SGD."""
    return 2 if optimizer in ("adamw", "adamw_8bit") else 1


def _pinned(nbytes: float, pin: bool) -> int:
    if not pin or nbytes <= 0:
        return int(nbytes)
    return 1 << (int(nbytes) - 1).bit_length()


@lru_cache(maxsize=1024)
def _pinned_groups(facts: ModelFacts, n: int, size: int, pin: bool) -> int:
    """Bytes of one rank's fp32 sub-group gradients on the host, each pinned block rounded as torch's
    pinned allocator rounds it (memoised per model and sub-group size)."""
    return sum(_pinned(_FP32 * g, pin) for g in _sub_groups(facts, n, size))


@lru_cache(maxsize=4096)
def _model_bytes(facts: ModelFacts, above: int = -1) -> float:
    """Bytes of the model's tensors with more than ``above`` elements (memoised per model)."""
    return _sum(facts.tensors, above=above)


def _sum(tensors: tuple[Tensor, ...], *, trainable: bool | None = None, above: int = -1) -> float:
    return sum(
        t.numel * t.elem_bytes * t.copies
        for t in tensors
        if (trainable is None or t.trainable == trainable) and t.numel > above
    )


# --- model states on the GPU -----------------------------------------------------------------------


def _device_weights(facts: ModelFacts, s: Setup) -> float:
    if s.zero_stage < 3:
        return _model_bytes(facts)
    threshold = s.knobs.param_persistence_threshold
    partitioned = _model_bytes(facts, threshold)
    persistent = _model_bytes(facts) - partitioned
    return persistent + (0 if s.offload_param != "none" else partitioned / s.num_gpus)


def _partition(s: Setup) -> int:
    return 1 if s.zero_stage == 0 else s.num_gpus


@dataclass(frozen=True, slots=True)
class _Phases:
    """Bytes of one kind of buffer in each phase of a step.

    ``persistent`` lives from initialisation on (so also at the loss, the forward/backward peak of
    most jobs); ``backward`` comes into being during backward and is released by the optimizer
    step; ``step`` exists only inside the optimizer step; ``accumulated`` is the part of
    ``backward`` that a micro-step before the accumulation boundary leaves for the next one's
    forward (and so for its loss).
    """

    persistent: float = 0.0
    backward: float = 0.0
    step: float = 0.0
    accumulated: float = 0.0


def _gradients(facts: ModelFacts, s: Setup, w: int) -> _Phases:
    t = facts.trainable_parameters
    part = t / _partition(s)
    offloaded = s.offload_optimizer != "none"
    largest = w * (facts.arch.largest_param if s.method == "full" else _largest_trainable(facts))
    accumulating = s.gradient_accumulation_steps > 1
    if s.zero_stage == 0:
        # The bf16 grads live through the step beside their fp32 upcasts: FusedAdam's FP16_Optimizer
        # upcasts every .grad in a list, then flattens it (two copies); FP16_UnfusedOptimizer, which
        # wraps every other optimizer, gives each master parameter its own (one). Between
        # micro-steps the .grads accumulate in place.
        upcasts = 2 if s.optimizer == "adamw" else 1
        return _Phases(backward=w * t, step=w * t + upcasts * _FP32 * t,
                       accumulated=w * t if accumulating else 0.0)
    if s.zero_stage == 1:
        # ZeRO-1 reduces only at the accumulation boundary: until then every .grad stays whole. The
        # boundary's epilogue flattens this rank's reduced partition and drops the .grads, so the
        # step holds what ZeRO-2's does: the flat bf16 partition and its fp32 upcast.
        copy = w * part if s.knobs.contiguous_gradients and not offloaded else 0.0
        step = 0.0 if offloaded else w * part + (w + _FP32) * part
        return _Phases(backward=w * t + copy, step=step, accumulated=w * t if accumulating else 0.0)
    if s.zero_stage == 2:
        if offloaded:  # each reduced gradient goes straight to the host's fp32 buffer
            return _Phases(backward=largest)
        # grads_in_partition is created at the first gradient and released by the step, which
        # flattens the partition and upcasts it to fp32; micro-steps accumulate into it.
        return _Phases(backward=w * part + largest, step=w * part + (w + _FP32) * part,
                       accumulated=w * part if accumulating else 0.0)
    if offloaded:  # ZeRO-3 keeps its gradient partition buffer on the host
        return _Phases(backward=largest)
    # ZeRO-3: the bf16 gradient partition buffer exists from initialisation; the step flattens
    # one sub-group's gradients and upcasts them to fp32 (the fp32 .grad is dropped after it).
    sub = min(part, s.knobs.sub_group_size)
    return _Phases(persistent=w * part, backward=largest, step=(w + _FP32) * sub)


@lru_cache(maxsize=1024)
def _largest_trainable(facts: ModelFacts) -> int:
    return max((t.numel for t in facts.tensors if t.trainable), default=0)


def _device_optimizer(facts: ModelFacts, s: Setup) -> float:
    if s.offload_optimizer != "none":
        return 0.0
    per_param = _FP32 + moment_bytes_per_param(s.optimizer)
    return per_param * facts.trainable_parameters / _partition(s)


def _zero_buffers(facts: ModelFacts, s: Setup, w: int) -> _Phases:
    """ZeRO's communication buffers in each phase."""
    k = s.knobs
    if s.zero_stage == 3:
        # One ipg bucket of reduce_bucket_size, allocated at initialisation, offload or not.
        return _Phases(persistent=float(k.reduce_bucket_size * w) if k.contiguous_gradients else 0.0)
    if s.zero_stage in (1, 2):
        # With optimizer offload a GPU staging buffer of the largest parameter lives throughout.
        staging = w * _largest_trainable(facts) if s.offload_optimizer != "none" else 0.0
        # setup_buckets allocates the ipg buffers at the first gradient of every backward, at
        # their full size, two with overlap_comm; the reduction's epilogue releases them: ZeRO-2's
        # after every backward, ZeRO-1's only at the accumulation boundary, so ZeRO-1's stay from
        # the first micro-step's backward to the step.
        per_bucket = float(k.reduce_bucket_size * w) if k.contiguous_gradients else 0.0
        buckets = (2 if k.overlap_comm else 1) * per_bucket
        held = buckets if s.zero_stage == 1 and s.gradient_accumulation_steps > 1 else 0.0
        return _Phases(persistent=staging, backward=buckets, accumulated=held)
    if s.num_gpus > 1:
        return _Phases(backward=float(min(facts.trainable_parameters, k.allgather_bucket_size) * w))
    return _Phases()


# --- ZeRO-3 gathered parameters ----------------------------------------------------------------------


def _trace(facts: ModelFacts, s: Setup) -> list[tuple[str, int, float, float]]:
    """Module trace of one micro-step at layer granularity: (unit, numel, bytes, largest module bytes)."""
    thr = s.knobs.param_persistence_threshold
    lay = facts.layer_tensors
    layer_numel = int(sum(t.numel * t.copies for t in lay if t.numel > thr))
    layer_bytes = _sum(lay, above=thr)
    largest = max((t.numel * t.elem_bytes for t in lay if t.numel > thr), default=0.0)
    arch = facts.arch
    emb = arch.embedding_params if arch.embedding_params > thr else 0
    emb_bytes = emb * (_FP32 if s.precision == "fp32" else 2)
    head = "E" if arch.tie_word_embeddings else "H"
    head_numel = emb if arch.tie_word_embeddings or arch.vocab_size * arch.hidden_size > thr else 0
    trace: list[tuple[str, int, float, float]] = [("E", emb, float(emb_bytes), float(emb_bytes))]
    trace += [(f"L{i}", layer_numel, layer_bytes, largest) for i in range(arch.num_layers)]
    trace.append((head, head_numel, emb_bytes, emb_bytes))
    trace.append((head, head_numel, emb_bytes, emb_bytes))
    for i in reversed(range(arch.num_layers)):
        if s.gradient_checkpointing:
            trace.append((f"L{i}", layer_numel, layer_bytes, largest))
        trace.append((f"L{i}", layer_numel, layer_bytes, largest))
    trace.append(("E", emb, emb_bytes, emb_bytes))
    return trace


def _gathered_bytes(facts: ModelFacts, s: Setup) -> float:
    if s.zero_stage != 3 or (s.num_gpus == 1 and s.offload_param == "none"):
        return 0.0
    # Prefetching fetches parameters that are already gathered at most once: never more than the
    # whole partitioned model is live.
    whole = _model_bytes(facts, s.knobs.param_persistence_threshold)
    return min(whole, _replay_gathered(facts, s.gradient_checkpointing, s.precision, s.knobs))


@lru_cache(maxsize=1024)
def _replay_gathered(facts: ModelFacts, checkpointing: bool, precision: Precision, knobs: ZeroKnobs) -> float:
    """Peak bytes of whole (gathered) parameters, replaying DeepSpeed's release rule.

    After a module runs, its parameters stay gathered if they are used again within
    ``stage3_max_reuse_distance`` elements of the trace; prefetching fetches up to
    ``stage3_prefetch_bucket_size`` elements ahead while fewer than ``stage3_max_live_parameters``
    are live. With one GPU and no parameter offload the "gathered" tensor is the partition itself.
    """
    s = Setup(
        method=Method.FULL,
        num_gpus=2,
        zero_stage=3,
        offload_optimizer=OffloadDevice.NONE,
        offload_param=OffloadDevice.NONE,
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        seq_len=1,
        gradient_checkpointing=checkpointing,
        precision=precision,
        optimizer=Optimizer.ADAMW,
        knobs=knobs,
    )
    trace = _trace(facts, s)
    n = len(trace)
    prefix = [0]
    for _, numel, _, _ in trace:
        prefix.append(prefix[-1] + numel)
    next_use: list[int | None] = [None] * n
    seen: dict[str, int] = {}
    for t in range(n - 1, -1, -1):
        next_use[t] = seen.get(trace[t][0])
        seen[trace[t][0]] = t
    held_bytes = [0.0] * (n + 1)
    held_numel = [0] * (n + 1)
    kept_after = [False] * n
    for t, (_, numel, nbytes, _) in enumerate(trace):
        nxt = next_use[t]
        if nxt is not None and prefix[nxt] - prefix[t + 1] < s.knobs.max_reuse_distance and nxt > t + 1:
            kept_after[t] = True
            held_bytes[t + 1] += nbytes
            held_bytes[nxt] -= nbytes
            held_numel[t + 1] += numel
            held_numel[nxt] -= numel
    peak = 0.0
    live_bytes, live_numel = 0.0, 0
    elem = _FP32 if s.precision == "fp32" else 2
    for t, (_, _numel, nbytes, largest) in enumerate(trace):
        live_bytes += held_bytes[t]
        live_numel += held_numel[t]
        current = nbytes if kept_after[t] or (t + 1 < n and trace[t + 1][0] == trace[t][0]) else largest
        budget = min(s.knobs.prefetch_bucket_size, s.knobs.max_live_parameters - live_numel)
        prefetch = max(0, min(budget, prefix[n] - prefix[t + 1])) * elem
        peak = max(peak, live_bytes + current + prefetch)
    return peak


# --- host and NVMe ------------------------------------------------------------------------------------


def _tied_head_copy(facts: ModelFacts, thr: int) -> float:
    """Bytes of the LM head's own weight that ZeRO-3 offload keeps beside a tied embedding:
    ``zero.Init`` partitions it as the model is built, before transformers ties it to the
    embedding, and what it offloaded stays behind (0 for an untied head, or one kept whole under
    the persistence threshold ``thr``). On the CPU its pinned block stays in torch's pinned-memory
    cache (on the H200 records, every tied model's pinned bytes after building exceed the
    partitions by exactly one embedding-sized block per rank, untied ones by nothing); on NVMe its
    swap file stays in the folder (tests/bench/test_nvme_records.py)."""
    arch = facts.arch
    vh = arch.vocab_size * arch.hidden_size
    if not arch.tie_word_embeddings or vh <= thr:
        return 0.0
    embedding = next(tn for tn in reversed(facts.tensors) if tn.numel == vh)  # after the layers
    return float(vh * embedding.elem_bytes)


@lru_cache(maxsize=1024)
def _offloaded_params(facts: ModelFacts, n: int, pin: bool, thr: int) -> float:
    """Host bytes of ZeRO-3's CPU parameter partitions, all ranks (the same for every micro-batch),
    with each rank's part of a tied model's LM head copy (``_tied_head_copy``)."""
    partitions = sum(
        _pinned(tn.numel * tn.elem_bytes / n, pin) * tn.copies for tn in facts.tensors if tn.numel > thr
    )
    if head := _tied_head_copy(facts, thr):
        partitions += _pinned(head / n, pin)
    return n * partitions


def _shard_bytes(facts: ModelFacts) -> float:
    """Host bytes of the largest weight file a ZeRO-3 from_pretrained holds at once."""
    whole = _model_bytes(facts)
    shard = facts.checkpoint_shard_bytes or C.CHECKPOINT_SHARD_BYTES
    return float(min(whole, shard))


@lru_cache(maxsize=1024)
def _sub_groups(facts: ModelFacts, n: int, size: int) -> tuple[int, ...]:
    """ZeRO-3's optimizer sub-groups on one rank, in elements.

    ``_create_fp16_sub_groups`` walks the trainable parameters in model order (embedding, the
    layers, the final norm, an untied head), adding each one's padded partition, and closes a group
    once it holds ``sub_group_size`` elements; a model smaller than that is one group.
    """
    n_layer = len(facts.layer_tensors)
    top = [t.numel for t in facts.tensors[n_layer:] if t.trainable]
    layer = [t.numel for t in facts.layer_tensors if t.trainable]
    order = top[:1] + layer * facts.arch.num_layers + top[1:]
    parts = [-(-numel // n) for numel in order]
    groups: list[int] = []
    acc = 0
    for numel in parts:
        acc += numel
        if acc >= size:
            groups.append(acc)
            acc = 0
    if acc:
        groups.append(acc)
    return tuple(groups)


def _checkpoint_save(facts: ModelFacts, s: Setup, w: int) -> float:
    """Host bytes a checkpoint save holds at once, all ranks, beyond the training process.

    ``engine.save_checkpoint`` runs first: torch.save copies each GPU-resident storage of the engine
    to the host one at a time, so a rank holds its largest: an fp32 master group of the optimizer
    on the GPU (ZeRO-3: a sub-group) or ZeRO 0-2's flat 16-bit group of what trains. ZeRO-0 keeps
    flat groups only for DeepSpeed's FusedAdam (AdamW) in 16-bit precision; with any other
    optimizer its wrapper keeps one fp32 master per parameter beside the module's own weights (in
    fp32 there is no wrapper), and the largest storage is one parameter's. Then rank 0 copies the
    weights it writes to the host (full fine-tuning: every 16-bit weight, and under ZeRO 0-2 a tied
    embedding once per name of the state dict; LoRA: the adapters) and holds them while
    ``save_pretrained`` writes them."""
    n, t = s.num_gpus, facts.trainable_parameters
    flat = s.zero_stage > 0 or _zero0_wrapper(s) == "fused"
    storage = t / _partition(s) if flat else _largest_trainable(facts)  # elements of the largest
    fp32 = 0.0
    if s.offload_optimizer == "none":
        if s.zero_stage == 3:
            fp32 = _FP32 * max(_sub_groups(facts, n, int(s.knobs.sub_group_size)), default=0)
        else:
            fp32 = _FP32 * storage
    torch_save = max(fp32, w * storage if s.zero_stage < 3 else 0.0)
    if s.method == "full":
        arch = facts.arch
        tied = arch.tie_word_embeddings and s.zero_stage < 3
        weights = w * (facts.num_parameters + (arch.vocab_size * arch.hidden_size if tied else 0))
    else:
        weights = w * t
    return (n - 1) * torch_save + max(torch_save, weights)


def host_staging_peak(num_gpus: int, staging_bytes: float) -> float:
    """Host RSS of all ranks while ZeRO-3 stages its partitions through the host (0: it does not)."""
    return num_gpus * C.HOST_INIT_PROCESS_BYTES + staging_bytes if staging_bytes else 0.0


def _host(facts: ModelFacts, s: Setup, w: int) -> tuple[HostEstimate, int]:
    n, t = s.num_gpus, facts.trainable_parameters
    pin = s.knobs.pin_memory
    part = t / (1 if s.zero_stage == 0 else n)
    master = optimizer = grads = params = pinned = first_step = 0.0
    nvme = 0.0
    moments = moment_bytes_per_param(s.optimizer)
    if s.offload_optimizer == "cpu" and s.zero_stage == 3:
        # the fp32 master is a plain host copy of each sub-group; each sub-group's fp32 .grad and the
        # bf16 gradient partition buffer are pinned
        groups = _sub_groups(facts, n, int(s.knobs.sub_group_size))
        master = n * _FP32 * part
        if s.offload_param == "none":
            # the step copies each updated fp32 sub-group into the bf16 partition on the GPU; the
            # dtype conversion happens on the host first, into a pageable bf16 copy of the group
            master += n * w * max(groups, default=0)
        grads = n * (_pinned_groups(facts, n, int(s.knobs.sub_group_size), pin) + _pinned(w * part, pin))
        optimizer = moments * t
    elif s.offload_optimizer == "cpu":
        # ZeRO-1/2: pinned fp32 master and fp32 .grad of the partition, a pinned bf16 copy of it for
        # the copy back to the GPU, and a pinned bf16 staging buffer of the largest parameter
        master = n * _pinned(_FP32 * part, pin)
        grads = n * _pinned(_FP32 * part, pin)
        if s.host_accumulation_buffer:
            grads += n * w * part  # per-parameter accumulation buffers across micro-steps
        pinned += n * (_pinned(w * part, pin) + _pinned(w * _largest_trainable(facts), pin))
        optimizer = moments * t
    elif s.offload_optimizer == "nvme":
        nvme += (_FP32 + moments + _FP32) * t
        sub = min(part, s.knobs.sub_group_size)
        # the swap buffers are page-locked by the async I/O op (posix_memalign), not torch's pinned
        # allocator, so their sizes are not rounded up; the bf16 gradient partition buffer stays on
        # the host, pinned, as with the optimizer on the CPU
        pinned += n * s.knobs.optimizer_buffer_count * _FP32 * sub
        grads = n * _pinned(w * part, pin)
        # the first step creates each sub-group's moments in pageable host memory before it swaps
        # them out, and converts the updated group to a pageable bf16 copy for the GPU (as with
        # the CPU): the largest group's stay beside the buffers until then
        first_step = n * (moments + w) * max(_sub_groups(facts, n, int(s.knobs.sub_group_size)), default=0)
    param_buffers = 0.0
    if s.zero_stage == 3 and s.offload_param == "cpu":
        params = _offloaded_params(facts, n, pin, s.knobs.param_persistence_threshold)
        # the trainable partitions are then copied into one flat pinned buffer per rank; the
        # per-parameter blocks they leave stay in torch's pinned-memory cache
        pinned += n * _pinned(w * part, pin)
    elif s.zero_stage == 3 and s.offload_param == "nvme":
        thr = s.knobs.param_persistence_threshold
        nvme += _model_bytes(facts, thr) + _tied_head_copy(facts, thr)
        param_buffers = n * s.knobs.param_buffer_count * s.knobs.param_buffer_size * w
        pinned += param_buffers
    # Stages 0-2 build the model on the host before moving it (QLoRA reads its checkpoint as stored,
    # in bf16, and quantises it on the GPU). ZeRO-3's zero.Init builds it in place, partitioned
    # (offloaded parameters included), and from_pretrained then reads the checkpoint one weight file
    # at a time into host memory on every rank; with the parameters on NVMe, zero.Init has already
    # made the swapper's page-locked buffers.
    stored = 2.0 * facts.num_parameters if s.method == "qlora" else _model_bytes(facts)
    load = n * stored if s.zero_stage < 3 else n * _shard_bytes(facts) + params + param_buffers
    # ZeRO-3 with the parameters on the GPU flattens each rank's trainable bf16 partitions at
    # deepspeed.initialize by copying them all into one host buffer and back (``defragment``),
    # after the load and before the offloaded states exist, in a process that has not yet loaded
    # what its first step loads.
    staging = n * w * part if s.zero_stage == 3 and s.offload_param == "none" else 0.0
    resident = master + optimizer + grads + params + pinned
    bookkeeping = n * C.HOST_PARAM_OFFLOAD_BYTES if s.zero_stage == 3 and s.offload_param == "cpu" else 0
    # ZeRO-3 loads inside zero.Init, which has made the CUDA context to partition onto the GPU: the
    # loading process is the one deepspeed.initialize sees; stages 0-2 load before touching the GPU
    process = n * (C.HOST_INIT_PROCESS_BYTES if s.zero_stage == 3 else C.HOST_PROCESS_BYTES) + bookkeeping
    # after its first steps a process holds the rest of the CUDA libraries; a checkpoint save then
    # adds its host copies on top of the offloaded states
    training = n * C.HOST_TRAINING_PROCESS_BYTES + bookkeeping
    save = _checkpoint_save(facts, s, w)
    total = max(process + load, training + resident + max(save, first_step), host_staging_peak(n, staging))
    host = HostEstimate(
        process_bytes=process,
        training_process_bytes=training,
        checkpoint_save_bytes=int(save),
        model_load_bytes=int(load),
        partition_staging_bytes=int(staging),
        first_step_states_bytes=int(first_step),
        optimizer_states_bytes=int(optimizer),
        master_weights_bytes=int(master),
        gradients_bytes=int(grads),
        parameters_bytes=int(params),
        pinned_buffers_bytes=int(pinned),
        total_bytes=int(total),
    )
    return host, int(nvme)


# --- the estimate -------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _activations(
    facts: ModelFacts,
    micro: int,
    seq: int,
    checkpointing: bool,
    method: Method,
    precision: Precision,
    attn: str,
    zero3: bool,
    loss_chunk_tokens: int | None = None,
    attention_mask: bool = False,
) -> ActivationEstimate:
    s = Setup(
        method=method,
        num_gpus=1,
        zero_stage=3 if zero3 else 0,
        offload_optimizer=OffloadDevice.NONE,
        offload_param=OffloadDevice.NONE,
        micro_batch_size=micro,
        gradient_accumulation_steps=1,
        seq_len=seq,
        gradient_checkpointing=checkpointing,
        precision=precision,
        optimizer=Optimizer.ADAMW,
        attn_implementation=attn,
        loss_chunk_tokens=loss_chunk_tokens,
        attention_mask=attention_mask,
    )
    return estimate_activations(facts.arch, s, facts.lora)


def estimate_memory(facts: ModelFacts, s: Setup, correction: float = 1.0) -> MemoryEstimate:
    """``s``'s memory on a box whose learned ``correction`` scales the allocator's slack and the CUDA
    context (``hardware.gpu_memory_correction``); the allocated terms stay what the structure gives."""
    w = weight_bytes(s.precision)
    weights = _device_weights(facts, s)
    grads = _gradients(facts, s, w)
    optim = _device_optimizer(facts, s)
    acts = _activations(
        facts,
        s.micro_batch_size,
        s.seq_len,
        s.gradient_checkpointing,
        s.method,
        s.precision,
        s.attn_implementation,
        s.zero_stage == 3,
        s.loss_chunk_tokens,
        s.attention_mask,
    )
    bufs = _zero_buffers(facts, s, w)
    gathered = _gathered_bytes(facts, s)
    resident = weights + optim + grads.persistent + bufs.persistent
    # Forward/backward peaks either at the loss (saved activations + vocab-sized fp32 tensors,
    # before any gradient of this micro-step exists) or later in backward (gradients and reduction
    # buckets).
    at_loss = acts.kept_at_loss_bytes + acts.logits_bytes
    in_backward = acts.backward_bytes + grads.backward + bufs.backward
    held = grads.accumulated + bufs.accumulated
    before_gradients = max(at_loss, _at_head_backward(facts, s, w, acts)) + held
    mid_backward, end_of_backward = _at_offloaded_gradient(facts, s, w, bufs)
    reducing = max(in_backward + mid_backward, end_of_backward)
    forward_backward = resident + gathered + max(before_gradients, reducing)
    step = resident + grads.step + bufs.step
    allocated = max(forward_backward, step)
    init_allocated, cache = _initialization(facts, s)
    cache += _beside_initialization_cache(facts, s, w)
    # where the allocated peak fits in initialisation's cache, ZeRO-1/2's buckets live and stay in it
    slack = correction * _allocator_slack(facts, s, w, gathered, buckets_beside=allocated > cache)
    context = correction * (C.CUDA_CONTEXT_BYTES + (C.NCCL_BYTES_PER_GPU if s.num_gpus > 1 else 0))
    init_reserved = cache + _reduction_stream_blocks(facts, s, w)
    # ZeRO-1's step runs beside the cached blocks of the per-parameter gradients it has just freed
    floor = max(init_reserved, step + _zero1_freed_gradients(facts, s, w))
    loss_moment = resident + gathered + before_gradients
    slack += _checkpoint_segments_beside_the_loss(facts, s, w, gathered, loss_moment, allocated)
    if _zero0_wrapper(s) == "unfused":
        # the step reuses the blocks of the gradients initialisation allocated: it needs no slack,
        # and what the loss could not fit in them stays reserved beside it, within the job's limit
        steady = max(forward_backward + slack, step + _unplaced_loss_blocks(facts, s, w))
    else:
        steady = allocated + slack
    host, nvme = _host(facts, s, w)
    return MemoryEstimate(
        weights_bytes=int(weights),
        gradients_bytes=int(grads.persistent + max(grads.backward, grads.step)),
        optimizer_states_bytes=int(optim),
        activations=acts,
        zero_buffers_bytes=int(bufs.persistent + max(bufs.backward, bufs.step)),
        gathered_parameters_bytes=int(gathered),
        optimizer_step_transient_bytes=int(grads.step),
        cuda_context_bytes=int(context),
        allocator_slack_bytes=int(slack),
        forward_backward_bytes=int(forward_backward),
        optimizer_step_bytes=int(step),
        total_bytes=int(max(steady, floor) + context),
        host=host,
        nvme_bytes=nvme,
        initialization_bytes=int(init_allocated),
        initialization_reserved_bytes=int(init_reserved),
        required_bytes=int(max(steady, init_allocated) + context),
    )


def _initialization(facts: ModelFacts, s: Setup) -> tuple[float, float]:
    """(allocated at its peak, reserved after it): ``deepspeed.initialize`` under ZeRO-1/2.

    ``DeepSpeedZeroOptimizer`` flattens the trainable parameters into one buffer, on the GPU when
    the card has room for it beside the model (else via the host), then clones this rank's
    partition of it on the GPU before casting the clone to the fp32 master (on the host under
    optimizer offload). The model's per-parameter blocks and the clone's block stay in the
    allocator's cache: small requests later reuse them, but NVML counts them from then on.
    """
    if s.zero_stage not in (1, 2):
        return 0.0, 0.0
    whole = _model_bytes(facts)
    flat = _sum(facts.tensors, trainable=True)
    clone = flat / s.num_gpus
    # The flatten's peak (the model beside its flat copy) is above the clone's, the host route's
    # (the frozen part, the flat buffer and the clone) too.
    return whole + flat, whole + flat + clone


def _zero0_wrapper(s: Setup) -> Literal["fused", "unfused"] | None:
    """The wrapper DeepSpeed puts around the optimizer under ZeRO-0 in 16-bit precision (none at other
    stages or in fp32): ``FP16_Optimizer``, flat groups, for its FusedAdam ("fused"), and
    ``FP16_UnfusedOptimizer``, one fp32 master per parameter, for any other ("unfused"). The unfused
    one's ``initialize_optimizer_states`` gives every trainable parameter a zero 16-bit and fp32
    gradient and runs one step, so the allocator's cache holds a block of each parameter's size in
    both dtypes from then on."""
    if s.zero_stage != 0 or s.precision == "fp32":
        return None
    return "fused" if s.optimizer == "adamw" else "unfused"


def _loss_requests(facts: ModelFacts, s: Setup, w: int) -> list[float]:
    """The loss's vocabulary-sized requests, in order: the 16-bit logits (and, soft-capped, tanh's
    output) and the three fp32 tensors of the loss's backward (``logits_bytes_per_token``)."""
    arch = facts.arch
    vocab_block = arch.vocab_size * s.logits_tokens
    return [float(w * vocab_block)] * (2 if arch.final_logit_softcapping else 1) + [_FP32 * vocab_block] * 3


def _unplaced(requests: list[float], blocks: tuple[float, ...]) -> float:
    """Bytes of ``requests`` that no free block of ``blocks`` (ascending) can hold, where PyTorch's
    allocator serves each request from the smallest free block at least its size, splitting it, and
    takes a new segment where none is large enough."""
    free = list(blocks[bisect_left(blocks, min(requests)) :]) if requests else []
    unplaced = 0.0
    for size in requests:
        i = bisect_left(free, size)
        if i == len(free):
            unplaced += size
            continue
        rest = free.pop(i) - size
        if rest > 0:
            insort(free, rest)
    return unplaced


def _unplaced_loss_blocks(facts: ModelFacts, s: Setup, w: int) -> float:
    """Bytes of the loss's vocabulary-sized blocks (``_loss_requests``) that no cached gradient block
    of an unfused ZeRO-0 optimizer's initialisation (``_zero0_wrapper``) can hold."""
    return _unplaced(_loss_requests(facts, s, w), _gradient_blocks(facts, w))


def _beside_initialization_cache(facts: ModelFacts, s: Setup, w: int) -> float:
    """ZeRO-1/2: bytes the first forward and backward reserve beside what initialisation left cached
    (``_initialization``). The free blocks of that cache are the trainable parameters' own blocks,
    which the flat buffer replaced, and the clone's; the loss's vocabulary-sized requests
    (``_loss_requests``) and, with a trainable LM head, its weight gradient, computed while they are
    live, take them or new segments (``_unplaced``)."""
    if s.zero_stage not in (1, 2):
        return 0.0
    arch = facts.arch
    own = [t.numel * t.elem_bytes for t in facts.tensors if t.trainable for _ in range(t.copies)]
    head = [float(w * arch.vocab_size * arch.hidden_size)] if s.method == "full" else []
    clone = _sum(facts.tensors, trainable=True) / s.num_gpus  # as ``_initialization`` clones it
    return _unplaced(_loss_requests(facts, s, w) + head, tuple(sorted([*own, clone])))


@lru_cache(maxsize=256)
def _gradient_blocks(facts: ModelFacts, w: int) -> tuple[float, ...]:
    """The cached blocks an unfused ZeRO-0 optimizer's initialisation leaves: each trainable
    tensor's gradient in ``w`` bytes and in fp32, ascending."""
    return tuple(sorted(float(b * t.numel) for t in facts.tensors if t.trainable
                        for b in (w, _FP32) for _ in range(t.copies)))


def _zero1_freed_gradients(facts: ModelFacts, s: Setup, w: int) -> float:
    """ZeRO-1 keeps each parameter's own .grad until the accumulation boundary, then reduces them
    through its buckets and frees them before its step: the step's flat fp32 partition cannot
    reuse those per-parameter blocks, so they stay reserved beside it (Phi-3 mini, ZeRO-1 with
    accumulation 2 on two H200s, ``python3 -m bench.measure --matrix heldout12``: reserved
    50.70 GiB at a 42.78 GiB step, the bf16 gradients 7.12 GiB)."""
    if s.zero_stage != 1 or s.offload_optimizer != "none":
        return 0.0
    return float(w * facts.trainable_parameters)


def _reduction_stream_blocks(facts: ModelFacts, s: Setup, w: int) -> float:
    """ZeRO-1/2 with the optimizer offloaded and ``overlap_comm``: blocks allocated on the reduction
    stream, which the default stream's cached blocks cannot serve. The fp64 copies of gradient
    slices whose norms are taken there: the first bucket reduced in backward sets the first block
    (an untied head's gradient, else a layer's); a larger gradient later (a tied embedding's) adds
    its own. On several GPUs, ``allreduce_bucket``'s flat copy of a bucket's gradients."""
    if s.zero_stage not in (1, 2) or s.offload_optimizer == "none" or not s.knobs.overlap_comm:
        return 0.0
    t = facts.trainable_parameters
    per_rank = t / s.num_gpus
    largest = min(_largest_trainable(facts), per_rank)
    head_first = s.method == "full" and not facts.arch.tie_word_embeddings
    first = largest if head_first else min(_largest_layer_trainable(facts), per_rank)
    norms = _FP64 * (first + (largest if largest > first else 0.0))
    flat_bucket = w * min(s.knobs.reduce_bucket_size, t) if s.num_gpus > 1 else 0.0
    return norms + flat_bucket


def _at_head_backward(facts: ModelFacts, s: Setup, w: int, acts: ActivationEstimate) -> float:
    """The LM head's backward with a trainable head: its weight gradient is computed while the
    logits' bf16 gradient and the fp32 gradient it was cast from are live; a tied embedding then
    accumulates its second gradient into a new tensor of the same size."""
    if s.method != "full":
        return 0.0
    arch = facts.arch
    act = 4 if s.precision == "fp32" else 2
    logits_grads = (act + _FP32) * arch.vocab_size * s.logits_tokens
    head = w * arch.vocab_size * arch.hidden_size * (2 if arch.tie_word_embeddings else 1)
    return acts.kept_at_loss_bytes + logits_grads + head


def _at_offloaded_gradient(facts: ModelFacts, s: Setup, w: int, bufs: _Phases) -> tuple[float, float]:
    """(in the middle of backward, above its activations and gradients; at its end, alone): what
    reducing a gradient adds with the optimizer offloaded, where DeepSpeed takes each gradient's
    norm on the GPU in fp64 before copying it to the host.

    ZeRO-1/2 (``set_norm_for_param_grad_in_gpu``) reduce a full bucket when the next gradient
    would overflow it: by then the gradients are views of the bucket, and each one's norm takes an
    fp64 copy of this rank's slice of it, one at a time. In backward that is a layer's gradient
    beside the activations; the last bucket, reduced after backward, may hold the largest (a tied
    embedding's), beside the buckets alone.
    ZeRO-3 (``partition_grads`` / ``_offload_grad_partition_at_boundary``), for each bucket it
    reduces during backward: on several GPUs the reduce-scatter's output for the bucket, and for
    each gradient in turn a GPU copy of its partition and the fp64 copy of up to 2.5e8 elements of
    it (``_constant_buffered_norm2``'s chunk); the bucket itself is resident. Swapping to NVMe
    keeps the fp32 copies of all the bucket's partitions until it writes them out together.
    """
    if s.offload_optimizer == "none" or s.zero_stage == 0:
        return 0.0, 0.0
    largest = _largest_trainable(facts)
    n = s.num_gpus
    if s.zero_stage == 3:
        bucket = min(s.knobs.reduce_bucket_size, facts.trainable_parameters)
        scattered = w * bucket / n if n > 1 else 0.0
        if s.offload_optimizer == "nvme":  # fp32 copies of the bucket's partitions, swapped out together
            scattered += _FP32 * bucket / n

        def reduced(numel: float) -> float:
            return w * numel / n + _FP64 * min(numel / n, reduction.NORM_CHUNK) + scattered

        return reduced(_largest_layer_trainable(facts)), reduced(largest)
    per_rank = facts.trainable_parameters / n
    mid = _FP64 * min(_largest_layer_trainable(facts), per_rank)
    return mid, _FP64 * min(largest, per_rank) + bufs.backward


@lru_cache(maxsize=1024)
def _largest_layer_trainable(facts: ModelFacts) -> int:
    return max((t.numel for t in facts.layer_tensors if t.trainable), default=0)


def _checkpoint_segments_beside_the_loss(facts: ModelFacts, s: Setup, w: int, gathered: float,
                                         at_loss: float, allocated: float) -> float:
    """Reserved bytes a checkpointed forward adds above the allocated peak (``CHECKPOINT_SEGMENTS``
    in calibration.json). Each layer's output, the next layer's checkpoint, is cut from the freed
    block of the layer's MLP intermediate, so a block holds floor(intermediate / hidden) checkpoints
    and the layers after take a new one; the two blocks of the last layer's MLP stay free beside
    them. The loss's vocabulary-sized requests fit in none, so these free bytes are reserved beside
    it, less what the blocks the step before cached hold (its largest gradient's fp32 block and one
    ZeRO-3 fetch, ``_fetch_block``). Backward's gradients and the step's blocks reuse them."""
    if not s.gradient_checkpointing:
        return 0.0
    arch = facts.arch
    act = 4 if s.precision == "fp32" else 2
    per_block = max(1, arch.intermediate_size // arch.hidden_size)
    blocks = -(-arch.num_layers // per_block) + 2
    per_token = act * (blocks * arch.intermediate_size - arch.num_layers * arch.hidden_size)
    free = per_token * s.tokens_per_micro_batch
    held = _FP32 * _largest_trainable(facts) + _fetch_block(facts, s, w, gathered)
    return max(0.0, at_loss + max(0.0, free - held) - allocated)


def _fetch_block(facts: ModelFacts, s: Setup, w: int, gathered: float) -> float:
    """One block of what ZeRO-3 fetches, where it fetches parameters (several GPUs or parameter
    offload; ``gathered`` > 0): the gathered parameters under full fine-tuning, the embedding's
    weight under LoRA (the gathered embedding and LM head)."""
    if gathered <= 0:
        return 0.0
    return gathered if s.method == "full" else w * facts.arch.vocab_size * facts.arch.hidden_size


def _allocator_slack(facts: ModelFacts, s: Setup, w: int, gathered: float, *, buckets_beside: bool) -> float:
    """Reserved minus allocated at the reserved peak: the allocator's fixed part, the cached
    vocabulary-sized blocks of the loss, the blocks the gradients leave (``_cached_gradient_blocks``),
    where ZeRO-3 fetches parameters (several GPUs or parameter offload) the cached blocks of the
    fetches (under full fine-tuning) or of the gathered embedding and LM head (under LoRA); ZeRO-1/2's freed
    reduce buckets when the step cannot reuse them and they live beside initialisation's cache
    (``buckets_beside``); ZeRO-2's accumulated gradient partition; and the soft-capped loss's extra
    block (see constants.py)."""
    arch = facts.arch
    fetch_blocks = (
        C.ALLOCATOR_GATHERED_BLOCKS if s.method == "full"
        else C.ALLOCATOR_VOCABULARY_BLOCKS if s.num_gpus > 1
        else C.ALLOCATOR_VOCABULARY_BLOCKS_ONE_GPU
    )
    return (
        C.ALLOCATOR_SLACK_BYTES
        + C.ALLOCATOR_LOGITS_BLOCKS * _FP32 * arch.vocab_size * s.logits_tokens
        + _cached_gradient_blocks(facts, s, w)
        + fetch_blocks * _fetch_block(facts, s, w, gathered)
        + (_stranded_buckets(facts, s, w) if buckets_beside else 0.0)
        + _accumulated_partition_block(facts, s, w)
        + _extra_loss_block(facts, s, w)
    )


def _cached_gradient_blocks(facts: ModelFacts, s: Setup, w: int) -> float:
    """The cached blocks the gradients leave. With the optimizer on the CPU, the segments of
    DeepSpeed's reduction stream, which the default stream cannot use: ZeRO-3's replayed
    (``planner/reduction.py``, ``ZERO3_REDUCTION_STREAM``), ZeRO-1/2's fp64 norm copies and flat
    bucket (``_reduction_stream_blocks``). Otherwise fitted blocks of the largest trainable tensor's
    size in fp32 (with the optimizer on NVMe, ``ALLOCATOR_LARGEST_GRADIENT_BLOCKS_OFFLOADED``)."""
    if s.offload_optimizer == "cpu" and s.zero_stage == 3:
        return float(reduction.reserved_bytes(facts.arch, facts.lora, w, s.num_gpus,
                                              int(s.knobs.reduce_bucket_size)))
    if s.offload_optimizer == "cpu" and s.zero_stage in (1, 2):
        return _reduction_stream_blocks(facts, s, w)
    largest = (
        C.ALLOCATOR_LARGEST_GRADIENT_BLOCKS_OFFLOADED
        if s.offload_optimizer != "none"
        else C.ALLOCATOR_LARGEST_GRADIENT_BLOCKS
    )
    return largest * _FP32 * _largest_trainable(facts)


def _accumulated_partition_block(facts: ModelFacts, s: Setup, w: int) -> float:
    """ZeRO-2 with accumulation and the optimizer on the GPU: one more cached block of the rank's
    bf16 gradient partition (``ALLOCATOR_ACCUMULATION_BLOCKS``)."""
    if s.zero_stage != 2 or s.gradient_accumulation_steps < 2 or s.offload_optimizer != "none":
        return 0.0
    return C.ALLOCATOR_ACCUMULATION_BLOCKS * w * facts.trainable_parameters / s.num_gpus


def _extra_loss_block(facts: ModelFacts, s: Setup, w: int) -> float:
    """One more fp32 logits-sized block of the loss where the logits are soft-capped (Gemma 2) and
    the forward keeps every layer's activations (no gradient checkpointing), or where the
    optimizer's moments take a block of the loss (``_moments_take_a_loss_block``): see constants.py,
    ``ALLOCATOR_SOFTCAP_BLOCKS`` and ``ALLOCATOR_MOMENTS_BLOCKS``. A soft-capped loss without
    checkpointing counts its block once."""
    arch = facts.arch
    block = _FP32 * arch.vocab_size * s.logits_tokens
    if arch.final_logit_softcapping and not s.gradient_checkpointing:
        return C.ALLOCATOR_SOFTCAP_BLOCKS * block
    if _moments_take_a_loss_block(facts, s, w):
        return C.ALLOCATOR_MOMENTS_BLOCKS * block
    return 0.0


def _first_step_moment(facts: ModelFacts, s: Setup) -> float:
    """Bytes of one optimizer moment tensor that the first optimizer step creates on the GPU
    (FusedAdam's states are lazy): one per flat fp32 partition under ZeRO-1/2, per sub-group under
    ZeRO-3; none where the optimizer runs on the host or ZeRO-0's optimizer wrapper creates them at
    initialisation."""
    if s.zero_stage == 0 or s.offload_optimizer != "none":
        return 0.0
    per_param = moment_bytes_per_param(s.optimizer) / _moment_tensors(s.optimizer)
    if s.zero_stage == 3:
        return per_param * max(_sub_groups(facts, s.num_gpus, int(s.knobs.sub_group_size)), default=0)
    return per_param * facts.trainable_parameters / s.num_gpus


def _moments_take_a_loss_block(facts: ModelFacts, s: Setup, w: int) -> bool:
    """Whether the moments the first optimizer step creates (``_first_step_moment``) find no cached
    block to fit in but the loss's, and the loss needs one more fp32 logits block from the next step
    on. Each must be larger than the largest block a decoder layer frees (an MLP intermediate; under
    eager attention the fp32 softmax of the scores, if larger) and no larger than the fp32 logits.
    A soft-capped loss keeps two bf16 logits blocks and three fp32 ones, and a moment in either
    costs it a block; an uncapped loss has room for moments that fit together in its bf16 logits
    block and loses an fp32 one only when they do not, and under ZeRO-3 none (the records of
    ``ALLOCATOR_MOMENTS_BLOCKS``)."""
    moment = _first_step_moment(facts, s)
    arch = facts.arch
    per_token = w * arch.intermediate_size
    if s.attn_implementation == "eager":
        per_token = max(per_token, _FP32 * arch.num_heads * s.seq_len)
    tokens, logits = s.tokens_per_micro_batch, s.logits_tokens
    if not per_token * tokens < moment <= _FP32 * arch.vocab_size * logits:
        return False
    if arch.final_logit_softcapping:
        return True
    return s.zero_stage != 3 and _moment_tensors(s.optimizer) * moment > w * arch.vocab_size * logits


def _stranded_buckets(facts: ModelFacts, s: Setup, w: int) -> float:
    """ZeRO-1/2's ipg buckets when a rank's bf16 gradient partition does not fit in one: freed
    blocks of the buckets' size that the larger requests around the step (a GPU step's flat bf16
    partition and fp32 copy; with optimizer offload, the partition's pinned copies) cannot reuse,
    so they stay in the cache beside the peak. Where the allocated peak fits in what initialisation
    left cached (``_beside_initialization_cache``), the buckets live in that cache's blocks and go
    back to them (``ZERO12_INITIALIZATION_CACHE``): none stays beside it."""
    k = s.knobs
    if s.zero_stage not in (1, 2) or not k.contiguous_gradients:
        return 0.0
    bucket = k.reduce_bucket_size * w
    if w * facts.trainable_parameters / s.num_gpus <= bucket:
        return 0.0
    return float((2 if k.overlap_comm else 1) * bucket)
