"""ZeRO-3's reduction stream at the accumulation boundary with the optimizer on the host.

DeepSpeed reduces gradients on a stream of its own, whose cached blocks the default stream cannot
use. ZeRO-3 fills its ipg bucket in the order backward makes gradients ready and reduces it when the
next gradient would overflow ``reduce_bucket_size`` (and once more after backward). Each reduction,
on that stream (``stage3.py``'s ``__reduce_and_partition_ipg_grads`` and ``partition_grads``):

* ``reduce_scatter_coalesced`` concatenates the bucket's gradients (every rank's share, padded) into
  one flat buffer, unless the bucket holds one tensor that needs no padding;
* for each gradient, in the order of the parameters' ids, a GPU copy of this rank's partition, the
  fp64 copy of each 2.5e8-element chunk of it (``_constant_buffered_norm2``) and its fp32 copy on
  its way to the host; the copy lives until the next gradient's replaces it.

What the stream keeps reserved is then what PyTorch's caching allocator makes of that sequence: a
request that no free block of the stream holds takes a new segment, so a bucket larger than every
block before it adds one, as does the first fp64 copy of a larger gradient. ``reserved_bytes``
replays the sequence through a model of the allocator (rounding, segment sizes, best fit, splitting).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

from planner.arch import Arch
from planner.lora import LoraTargets

__all__ = ["NORM_CHUNK", "reserved_bytes", "segments", "trainable_order"]

_MIB = 2**20
_ROUND = 2 * _MIB  # a large segment's size is its request's rounded up to this
#: ZeRO-3's _constant_buffered_norm2 takes a gradient's norm in fp64 chunks of this many elements
NORM_CHUNK = 250_000_000
_FP64 = 8
_FP32 = 4


@dataclass(frozen=True, slots=True)
class _Param:
    ds_id: int  # registration order: the order ZeRO-3 processes a bucket's gradients in
    numel: int


def trainable_order(arch: Arch, lora: LoraTargets | None) -> tuple[tuple[int, int], ...]:
    """The trainable parameters as (registration index, elements), in the order backward makes
    their gradients ready: an untied LM head, the final norm, then the decoder layers from the last,
    each from its MLP's down projection back to its input norm (linears in reverse, so the up
    projection before the gate), and the embedding last. Under LoRA only the adapters train, B
    before A."""
    ids = itertools.count()

    def param(numel: int) -> _Param:
        return _Param(next(ids), numel)

    vocab = arch.vocab_size * arch.hidden_size
    full = lora is None
    embedding = [param(vocab)] if full else []
    if lora is not None and lora.embed_tokens:
        embedding = [param(lora.r * arch.vocab_size), param(arch.hidden_size * lora.r)]
    adapted = lora.layer_linears if lora is not None else ()
    layers: list[list[_Param]] = []
    for _ in range(arch.num_layers):
        mlp: list[list[_Param]] = []
        attention: list[list[_Param]] = []
        for lin in arch.linears:
            own: list[_Param] = []
            if full:
                own = [param(lin.in_features * lin.out_features)]
                own += [param(lin.out_features)] if lin.bias else []
            elif lora is not None and lin in adapted:
                a = param(lora.r * lin.in_features)
                own = [param(lin.out_features * lora.r), a]
            (mlp if lin.name.startswith("mlp.") else attention).insert(0, own)
        norms = [param(size) for size in arch.norm_sizes] if full else []
        backward = [p for own in mlp for p in own] + norms[1:] + [p for own in attention for p in own]
        layers.append(backward + norms[:1])
    top: list[_Param] = [param(arch.hidden_size)] if full else []  # the final norm
    if full and not arch.tie_word_embeddings:
        top.insert(0, param(vocab))
    if lora is not None and lora.lm_head:
        a, b = param(lora.r * arch.hidden_size), param(arch.vocab_size * lora.r)
        top = [b, a]
    order = top + [p for layer in reversed(layers) for p in layer] + list(reversed(embedding))
    return tuple((p.ds_id, p.numel) for p in order)


class _Stream:
    """PyTorch's caching allocator on one stream: requests rounded to 512 bytes; those up to 1 MiB
    from 2 MiB segments, those up to 10 MiB from 20 MiB ones, larger ones from a segment of their
    size rounded to 2 MiB; the smallest free block that holds a request serves it, split when more
    than 1 MiB (512 bytes for small blocks) would be left; freed blocks merge with free neighbours."""

    def __init__(self) -> None:
        #: (small pool, bytes, blocks as [offset, bytes, free])
        self.segments: list[tuple[bool, int, list[list[int]]]] = []
        self.live: dict[int, tuple[int, int]] = {}
        self.handles = 0

    def alloc(self, nbytes: float) -> int:
        size = max(512, math.ceil(nbytes / 512) * 512)
        small = size <= _MIB
        best: tuple[int, int] | None = None
        best_size = 0
        for si, (seg_small, _, blocks) in enumerate(self.segments):
            if seg_small != small:
                continue
            for bi, (_, bsize, free) in enumerate(blocks):
                if free and bsize >= size and (best is None or bsize < best_size):
                    best, best_size = (si, bi), bsize
        if best is None:
            total = math.ceil(size / _ROUND) * _ROUND
            if small or size < 10 * _MIB:
                total = 2 * _MIB if small else 20 * _MIB
            self.segments.append((small, total, [[0, total, 1]]))
            best = (len(self.segments) - 1, 0)
        si, bi = best
        blocks = self.segments[si][2]
        offset, bsize, _ = blocks[bi]
        if bsize - size >= (512 if small else _MIB):
            blocks[bi:bi + 1] = [[offset, size, 0], [offset + size, bsize - size, 1]]
        else:
            blocks[bi][2] = 0
        self.handles += 1
        self.live[self.handles] = (si, offset)
        return self.handles

    def free(self, handle: int) -> None:
        si, offset = self.live.pop(handle)
        blocks = self.segments[si][2]
        i = next(k for k, b in enumerate(blocks) if b[0] == offset)
        blocks[i][2] = 1
        if i + 1 < len(blocks) and blocks[i + 1][2]:
            blocks[i][1] += blocks.pop(i + 1)[1]
        if i > 0 and blocks[i - 1][2]:
            blocks[i - 1][1] += blocks.pop(i)[1]

    def segment_sizes(self) -> tuple[int, ...]:
        return tuple(size for _, size, _ in self.segments)


def _buckets(order: tuple[tuple[int, int], ...], bucket_size: int) -> list[list[tuple[int, int]]]:
    buckets: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    elements = 0
    for ds_id, numel in order:
        if current and elements + numel > bucket_size:
            buckets.append(current)
            current, elements = [], 0
        current.append((ds_id, numel))
        elements += numel
    if current:
        buckets.append(current)
    return [sorted(b) for b in buckets]


@lru_cache(maxsize=256)
def segments(arch: Arch, lora: LoraTargets | None, w: int, num_gpus: int,
             bucket_size: int) -> tuple[int, ...]:
    """The reduction stream's segments after one accumulation boundary (later ones reuse them)."""
    stream = _Stream()
    for bucket in _buckets(trainable_order(arch, lora), bucket_size):
        flat = None
        if len(bucket) > 1 or bucket[0][1] % num_gpus:
            flat = stream.alloc(w * sum(math.ceil(numel / num_gpus) * num_gpus for _, numel in bucket))
        copy = None
        for _, numel in bucket:
            part = math.ceil(numel / num_gpus)
            if copy is not None:
                stream.free(copy)
            copy = stream.alloc(w * part)
            for start in range(0, part, NORM_CHUNK):
                stream.free(stream.alloc(_FP64 * min(NORM_CHUNK, part - start)))
            stream.free(stream.alloc(_FP32 * part))
        if copy is not None:
            stream.free(copy)
        if flat is not None:
            stream.free(flat)
    return stream.segment_sizes()


def reserved_bytes(arch: Arch, lora: LoraTargets | None, w: int, num_gpus: int, bucket_size: int) -> int:
    """Bytes ZeRO-3's reduction stream keeps reserved with the optimizer on the host."""
    return sum(segments(arch, lora, w, num_gpus, bucket_size))
