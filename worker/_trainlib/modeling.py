"""Loading the tokenizer and model from a local folder, LoRA, and the pre-flight device checks."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from worker._trainlib.runfile import ERROR, USER_ERROR, JobFailure, classify

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json",
                    "spiece.model", "vocab.txt")


def torch_dtype(precision: str, device: str) -> Any:
    import torch

    if device == "cpu" and precision == "fp16":
        return torch.float32  # half matmuls are missing or very slow on the CPU
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]


def limit_gpu_memory(limit_bytes: int | None, device: int) -> float | None:
    """Hold PyTorch's caching allocator on ``device`` to ``limit_bytes`` (on a shared card, the
    plan's ``allocator_limit_bytes`` plus the tolerance). Past it the allocator frees its cached
    blocks and retries before it reports an out-of-memory error, so the process keeps to its lease
    instead of caching what it freed. Returns the fraction of the card set, ``None`` where there is
    no limit."""
    if limit_bytes is None:
        return None
    import torch

    total = int(torch.cuda.mem_get_info(device)[1])
    fraction = min(1.0, limit_bytes / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


_REQUEST = re.compile(r"Tried to allocate ([0-9.]+) (GiB|MiB|KiB|B)\b")
_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}


def oom_figures(exc: BaseException, limit_bytes: int | None, device: int) -> dict[str, Any]:
    """What PyTorch held on ``device`` when ``exc`` (its out-of-memory error) was raised: the
    allocator limit it ran under, its reserved and allocated peaks, and the request that failed
    (from the error's message, the only place PyTorch states it)."""
    import torch

    found = _REQUEST.search(str(exc))
    requested = int(float(found.group(1)) * _UNITS[found.group(2)]) if found else None
    return {"gpu_memory_limit_bytes": limit_bytes,
            "max_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
            "max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "requested_bytes": requested}


def check_model_folder(path: Path) -> None:
    if not path.is_dir():
        raise JobFailure(USER_ERROR, "bad_model", f"model folder not found: {path}")
    if not (path / "config.json").is_file():
        raise JobFailure(USER_ERROR, "bad_model",
                         f"{path} has no config.json (not a Hugging Face model folder)")


def _reraise_resource_failure(exc: BaseException) -> None:
    failure = classify(exc)
    if failure.reason in ("cuda_oom", "host_oom", "disk_full"):
        raise failure from exc


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise JobFailure(USER_ERROR, "missing_tokenizer", f"{path} has no tokenizer files")
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        _reraise_resource_failure(exc)
        raise JobFailure(USER_ERROR, "missing_tokenizer",
                         f"cannot load the tokenizer of {path}: {exc}") from exc


def load_causal_lm(path: Path, dtype: Any, **kwargs: Any) -> Any:
    from transformers import AutoModelForCausalLM

    check_model_folder(path)
    try:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True, **kwargs)
    except Exception as exc:
        _reraise_resource_failure(exc)
        attn = kwargs.get("attn_implementation")
        if attn and "attention implementation" in str(exc):  # e.g. SDPA for Gemma 2 in transformers 5.24
            raise JobFailure(USER_ERROR, "attn_unavailable",
                             f"training.attn_implementation {attn}: the installed transformers cannot "
                             f"run it for this model ({exc}); leave it unset for transformers' own "
                             "choice") from exc
        raise JobFailure(USER_ERROR, "bad_model", f"cannot load the model in {path}: {exc}") from exc


def attention_kwargs(impl: str | None) -> dict[str, Any]:
    """``attn_implementation`` for from_pretrained: the attention the plan was made for, so the
    memory it planned is the memory the model takes whatever transformers would pick; flash
    attention is refused early when absent."""
    if impl is None:
        return {}
    if impl == "flash_attention_2":
        try:
            import flash_attn  # noqa: F401
        except Exception as exc:
            raise JobFailure(USER_ERROR, "attn_unavailable", "training.attn_implementation "
                             f"flash_attention_2 needs the flash-attn package ({exc}); use sdpa") from exc
    return {"attn_implementation": impl}


def check_8bit_optimizer(device: str) -> None:
    if device != "cuda":
        raise JobFailure(USER_ERROR, "optimizer_unavailable", "training.optimizer adamw_8bit needs a CUDA "
                         "GPU; use adamw")
    try:
        import bitsandbytes  # noqa: F401
    except Exception as exc:
        raise JobFailure(USER_ERROR, "optimizer_unavailable", "training.optimizer adamw_8bit needs "
                         f"bitsandbytes, which does not import here ({exc}); use adamw") from exc


def build_optimizer(name: str, params: list[Any], lr: float, weight_decay: float, device: str) -> Any:
    """The client optimizer for names the DeepSpeed config cannot declare (8-bit AdamW)."""
    if name != "adamw_8bit":
        return None
    check_8bit_optimizer(device)
    import bitsandbytes as bnb

    return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=weight_decay)


def check_qlora(device: str) -> None:
    """QLoRA needs bitsandbytes and a GPU; refuse before loading anything otherwise."""
    if device != "cuda":
        raise JobFailure(USER_ERROR, "qlora_unavailable", "method qlora needs a CUDA GPU (this run is on "
                         f"{device}); use method lora")
    try:
        import bitsandbytes  # noqa: F401
    except Exception as exc:
        raise JobFailure(USER_ERROR, "qlora_unavailable", "method qlora needs bitsandbytes, which does not "
                         f"import here ({type(exc).__name__}: {exc}); use method lora") from exc


def qlora_kwargs(dtype: Any) -> dict[str, Any]:
    from transformers import BitsAndBytesConfig

    quant = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype)
    return {"quantization_config": quant, "device_map": {"": int(os.environ.get("LOCAL_RANK", "0"))}}


def enable_checkpointing(model: Any, lora: bool) -> None:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        # frozen embeddings give checkpointed blocks inputs without grad; LoRA needs them to have it
        model.enable_input_require_grads()


def apply_lora(model: Any, lora: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        raise JobFailure(USER_ERROR, "bad_lora_targets", f"lora.target_modules: {exc}") from exc


def _normalise_uuid(uuid: str) -> str:
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def visible_gpu_uuids() -> list[str]:
    """UUIDs of the GPUs this process sees, in CUDA order, via NVML and CUDA_VISIBLE_DEVICES."""
    import pynvml

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    every = [_as_str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [_normalise_uuid(u) for u in every]
    out = []
    for item in (v.strip() for v in visible.split(",") if v.strip()):
        if item.isdigit():
            out.append(_normalise_uuid(every[int(item)]))
        else:
            out.append(_normalise_uuid(item))
    return out


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_gpus(expected: str | None) -> None:
    """With TUNEBOX_EXPECTED_GPU_UUIDS set, the visible GPUs must be exactly the leased ones."""
    import torch

    if not torch.cuda.is_available():
        raise JobFailure(ERROR, "no_gpu", "the plan needs CUDA but torch sees no GPU")
    if not expected:
        return
    want = {_normalise_uuid(u) for u in expected.split(",") if u.strip()}
    try:
        seen = visible_gpu_uuids()
    except Exception as exc:
        raise JobFailure(ERROR, "gpu_mismatch",
                         f"cannot list GPUs with NVML to check the lease: {exc}") from exc
    if set(seen) != want or len(seen) != torch.cuda.device_count():
        raise JobFailure(ERROR, "gpu_mismatch",
                         f"visible GPUs {sorted(seen)} are not the leased {sorted(want)}")


# --------------------------------------------------------------------------- the loss without full logits


def chunked_cross_entropy(hidden: Any, head: Any, labels: Any, chunk_tokens: int,
                          softcap: float | None = None) -> Any:
    """The causal LM loss (mean over labelled positions, as transformers computes it) from the final
    hidden states, ``chunk_tokens`` positions at a time: only labelled positions are projected, and each
    chunk's logits are recomputed in backward instead of kept, so the fp32 logits of the whole
    micro-batch never exist."""
    import torch
    from torch.utils.checkpoint import checkpoint

    targets = labels[:, 1:].reshape(-1)
    keep = targets != -100
    picked = hidden[:, :-1].reshape(-1, hidden.shape[-1])[keep]
    targets = targets[keep]
    count = int(targets.numel())
    if count == 0:
        return hidden.sum() * 0.0

    def piece(h: Any, y: Any) -> Any:
        logits = head(h).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return torch.nn.functional.cross_entropy(logits, y, reduction="sum")

    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, count, chunk_tokens):
        end = start + chunk_tokens
        total = total + checkpoint(piece, picked[start:end], targets[start:end], use_reentrant=False)
    return total / count


class ChunkedLoss:
    """Runs a causal LM (a DeepSpeed engine, a peft or a transformers model) without its logits: a
    pre-hook on the output head takes the final hidden states and hands the head an empty slice, then
    :func:`chunked_cross_entropy` computes the loss from them."""

    def __init__(self, model: Any, chunk_tokens: int):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.head = base.get_output_embeddings()
        if self.head is None:
            raise ValueError("the model has no output head")
        self.softcap = getattr(base.config, "final_logit_softcapping", None)
        self.chunk_tokens = chunk_tokens
        self._hidden: Any = None
        self._armed = False
        self.head.register_forward_pre_hook(self._take_hidden)

    def _take_hidden(self, module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if not self._armed:
            return None
        self._armed = False
        self._hidden = args[0]
        return (args[0][:, :0], *args[1:])

    def __call__(self, forward: Any, batch: dict[str, Any]) -> Any:
        """The loss of ``batch`` through ``forward`` (the engine or model call)."""
        labels = batch["labels"]
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        self._armed = True
        try:
            forward(**inputs, use_cache=False)
        finally:
            self._armed = False
        hidden, self._hidden = self._hidden, None
        if hidden is None:
            raise RuntimeError("the model's forward did not call its output head")
        return chunked_cross_entropy(hidden, self.head, labels, self.chunk_tokens, self.softcap)
