"""A fully resolved training configuration: what the estimators take (no "auto" left)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.enums import Method, OffloadDevice, Optimizer, Precision

__all__ = ["Method", "OffloadDevice", "Optimizer", "Precision", "Setup", "ZeroKnobs"]


@dataclass(frozen=True, slots=True)
class ZeroKnobs:
    """The ZeRO settings that change memory. Defaults: the field report's skeleton."""

    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    prefetch_bucket_size: int = 500_000_000
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    sub_group_size: int = 1_000_000_000
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    pin_memory: bool = True
    optimizer_buffer_count: int = 4
    param_buffer_count: int = 5
    param_buffer_size: int = 100_000_000


@dataclass(frozen=True, slots=True)
class Setup:
    method: Method
    num_gpus: int
    zero_stage: int
    offload_optimizer: OffloadDevice
    offload_param: OffloadDevice
    micro_batch_size: int
    gradient_accumulation_steps: int
    seq_len: int
    gradient_checkpointing: bool
    precision: Precision
    optimizer: Optimizer
    attn_implementation: str = "sdpa"
    knobs: ZeroKnobs = ZeroKnobs()
    #: the loss computed this many positions at a time (training.loss_chunk_tokens); None: full logits
    loss_chunk_tokens: int | None = None
    #: whether the attention gets an explicit mask: a row holding more than one sequence (packing) or
    #: padding (a packed row's gap, a padded batch); SDPA then runs its masked kernel (see activations.py)
    attention_mask: bool = False

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch_size * self.seq_len

    @property
    def passes(self) -> int:
        """Passes over the layers in a micro-step: the forward, its recompute under gradient
        checkpointing, and the backward."""
        return 3 if self.gradient_checkpointing else 2

    @property
    def forwards(self) -> int:
        """Forward passes over the layers in a micro-step: two under gradient checkpointing."""
        return self.passes - 1

    @property
    def logits_tokens(self) -> int:
        """The positions whose vocabulary-sized logits exist at once: a chunk, or the micro-batch."""
        if self.loss_chunk_tokens is None:
            return self.tokens_per_micro_batch
        return min(self.tokens_per_micro_batch, self.loss_chunk_tokens)

    @property
    def host_accumulation_buffer(self) -> bool:
        """Whether DeepSpeed accumulates gradients in a bf16 host buffer per parameter across
        micro-steps: ZeRO-2 with the optimizer offloaded and accumulation, which reduces (and moves)
        every micro-step's gradients. ZeRO-1 keeps them in ``.grad`` on the GPU until the boundary
        reduces them once; ZeRO-3 accumulates its partitions on the GPU."""
        offloaded = self.offload_optimizer != "none"
        return self.zero_stage == 2 and offloaded and self.gradient_accumulation_steps > 1

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps * self.num_gpus

    def with_(self, **changes: object) -> Setup:
        return replace(self, **changes)  # type: ignore[arg-type]
