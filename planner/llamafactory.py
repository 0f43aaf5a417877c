"""A LLaMA-Factory training YAML (the keys its ``examples/`` use) as a tunebox job spec.

:func:`convert` maps what tunebox has an equivalent for and lists every other key with the reason
it is not taken (``Converted.unmapped``): nothing is dropped unsaid. A key whose value tunebox
cannot honour (a DPO stage, 8-bit quantisation, two datasets) raises :class:`PlanError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from planner.errors import PlanError

__all__ = ["Converted", "convert"]

#: LLaMA-Factory key -> tunebox spec location, for values that carry over as they are
_DIRECT = {
    "cutoff_len": "training.seq_len",
    "per_device_train_batch_size": "training.micro_batch_size",
    "gradient_accumulation_steps": "training.gradient_accumulation_steps",
    "learning_rate": "training.learning_rate",
    "num_train_epochs": "training.epochs",
    "max_steps": "training.max_steps",
    "warmup_ratio": "training.warmup_ratio",
    "weight_decay": "training.weight_decay",
    "save_steps": "training.save_steps",
    "seed": "training.seed",
    "lora_rank": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "val_size": "dataset.eval_fraction",
}
#: keys read by the conversion itself
_READ = frozenset(
    {
        "model_name_or_path",
        "finetuning_type",
        "lora_target",
        "quantization_bit",
        "quantization_method",
        "deepspeed",
        "dataset",
        "dataset_dir",
        "eval_dataset",
        "stage",
        "do_train",
        "bf16",
        "fp16",
        "pure_bf16",
        "lr_scheduler_type",
        "disable_gradient_checkpointing",
        "optim",
    }
)
#: keys with no tunebox equivalent, and why
_NOT_TAKEN = {
    "template": "the model's own chat template renders the conversations",
    "output_dir": "tunebox keeps a job's checkpoints in its job folder (`tunebox export` copies them out)",
    "overwrite_output_dir": "each job has its own folder",
    "logging_steps": "progress is recorded every step",
    "plot_loss": "GET /v1/jobs/{id}/metrics has the loss curve",
    "report_to": "tunebox records metrics itself",
    "trust_remote_code": "models load with their config's own classes",
    "max_samples": "the whole dataset file is used",
    "preprocessing_num_workers": "tunebox tokenises in the training process",
    "dataloader_num_workers": "tunebox tokenises in the training process",
    "ddp_timeout": "DeepSpeed's own timeout applies",
    "resume_from_checkpoint": "a job resumes from its own newest checkpoint (pause and resume)",
    "save_only_model": "checkpoints always hold what resuming needs",
    "do_eval": "set eval.when in the spec",
    "eval_strategy": "set eval.when in the spec",
    "eval_steps": "set eval.every_steps in the spec",
    "per_device_eval_batch_size": "set eval.batch_size in the spec",
}
_SCHEDULERS = {
    "cosine": "cosine",
    "linear": "linear",
    "constant": "constant",
    "constant_with_warmup": "constant",
}
_OPTIMIZERS = {
    "adamw_torch": "adamw",
    "adamw_hf": "adamw",
    "adamw_torch_fused": "adamw",
    "adamw_8bit": "adamw_8bit",
    "adamw_bnb_8bit": "adamw_8bit",
    "paged_adamw_8bit": "adamw_8bit",
    "sgd": "sgd",
    "lion_32bit": "lion",
}


@dataclass
class Converted:
    spec: dict[str, Any]
    #: LLaMA-Factory keys not taken, each with the reason
    unmapped: dict[str, str] = field(default_factory=dict)


def _put(spec: dict[str, Any], path: str, value: Any) -> None:
    section, key = path.split(".", 1)
    spec.setdefault(section, {})[key] = value


def _method(config: Mapping[str, Any]) -> str:
    kind = str(config.get("finetuning_type", "lora"))
    bits = config.get("quantization_bit")
    if kind not in ("lora", "full"):
        raise PlanError("finetuning_type", f"tunebox trains lora, qlora or full, not {kind!r}")
    if bits is None:
        return kind
    if kind != "lora" or int(bits) != 4 or config.get("quantization_method", "bnb") != "bnb":
        raise PlanError(
            "quantization_bit",
            "tunebox quantises only 4-bit with bitsandbytes, under LoRA "
            f"(QLoRA); got {bits}-bit {config.get('quantization_method', 'bnb')} {kind}",
        )
    return "qlora"


def _targets(value: Any) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(t).strip() for t in items if str(t).strip()]
    return ["all-linear" if name == "all" else str(name) for name in names]


def _dataset(config: Mapping[str, Any], info: Mapping[str, Any] | None, key: str = "dataset"
             ) -> dict[str, Any]:
    """The data source that ``config[key]`` (``dataset`` or ``eval_dataset``) names."""
    names = [n.strip() for n in str(config.get(key, "")).split(",") if n.strip()]
    if len(names) != 1:
        raise PlanError(
            key,
            f"tunebox {'trains' if key == 'dataset' else 'evaluates'} on one dataset file; "
            f"{len(names)} named ({names}): merge them into one file first",
        )
    folder = str(config.get("dataset_dir", "data")).rstrip("/")
    entry = (info or {}).get(names[0])
    if not isinstance(entry, Mapping) or "file_name" not in entry:
        return {"path": f"{folder}/{names[0]}", "format": "auto"}
    fmt = str(entry.get("formatting", "alpaca"))
    known = fmt if fmt in ("alpaca", "sharegpt") else "auto"
    return {"path": f"{folder}/{entry['file_name']}", "format": known}


def _training_choices(config: Mapping[str, Any], spec: dict[str, Any]) -> None:
    if config.get("bf16") or config.get("pure_bf16"):
        _put(spec, "training.precision", "bf16")
    elif config.get("fp16"):
        _put(spec, "training.precision", "fp16")
    if "lr_scheduler_type" in config:
        kind = str(config["lr_scheduler_type"])
        if kind not in _SCHEDULERS:
            raise PlanError(
                "lr_scheduler_type", f"tunebox schedules {', '.join(sorted(_SCHEDULERS))}; not {kind!r}"
            )
        _put(spec, "training.lr_scheduler", _SCHEDULERS[kind])
    if "optim" in config:
        kind = str(config["optim"])
        if kind not in _OPTIMIZERS:
            raise PlanError(
                "optim", f"tunebox's optimizers are {', '.join(sorted(_OPTIMIZERS))}; not {kind!r}"
            )
        _put(spec, "training.optimizer", _OPTIMIZERS[kind])
    if config.get("disable_gradient_checkpointing"):
        _put(spec, "training.gradient_checkpointing", False)


def convert(
    config: Mapping[str, Any],
    *,
    deepspeed: Mapping[str, Any] | None = None,
    dataset_info: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> Converted:
    """The spec of LLaMA-Factory training ``config``. ``deepspeed`` is the JSON its ``deepspeed`` key
    names, ``dataset_info`` the ``dataset_info.json`` of its ``dataset_dir`` (where the caller has them)."""
    if str(config.get("stage", "sft")) != "sft":
        raise PlanError("stage", f"tunebox runs supervised fine-tuning (stage: sft), not {config['stage']!r}")
    if config.get("do_train") is False:
        raise PlanError("do_train", "the config does not train (do_train: false)")
    if "model_name_or_path" not in config:
        raise PlanError("model_name_or_path", "the config names no model")
    method = _method(config)
    spec: dict[str, Any] = {
        "name": name
        or str(config.get("output_dir") or "llamafactory").rstrip("/").split("/")[-1][:200]
        or "llamafactory",
        "model": {"path": str(config["model_name_or_path"])},
        "method": method,
        "dataset": _dataset(config, dataset_info),
    }
    if config.get("eval_dataset"):
        spec["eval"] = {"dataset": _dataset(config, dataset_info, "eval_dataset")}
    for key, path in _DIRECT.items():
        if key in config and config[key] is not None:
            _put(spec, path, config[key])
    if "num_train_epochs" in config and "max_steps" not in config:
        _put(spec, "training.max_steps", None)
    if method == "full":
        spec.pop("lora", None)
    elif "lora_target" in config:
        _put(spec, "lora.target_modules", _targets(config["lora_target"]))
    if method != "full" and "lora_rank" in config and "lora_alpha" not in config:
        _put(spec, "lora.alpha", 2 * config["lora_rank"])  # LLaMA-Factory's default alpha
    _training_choices(config, spec)
    if config.get("deepspeed"):
        if deepspeed is None:
            raise PlanError("deepspeed", f"the DeepSpeed config {config['deepspeed']!r} was not read")
        _put(spec, "resources.deepspeed", dict(deepspeed))
    unmapped = {
        key: _NOT_TAKEN.get(key, "tunebox has no such setting")
        for key in config
        if key not in _DIRECT and key not in _READ
    }
    return Converted(spec, unmapped)
