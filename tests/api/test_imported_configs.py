"""The configs users already have: a whole DeepSpeed config in the HF Trainer's form as
``resources.deepspeed``, and LLaMA-Factory training YAMLs, planned through ``POST /v1/plans``.

The files under ``tests/data/llamafactory`` are copies of LLaMA-Factory's ``examples/deepspeed/*.json``
and ``examples/train_*/qwen3_*.yaml`` (hiyouga/LLaMA-Factory at ff6d4d12e).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner import PlanError
from planner.llamafactory import convert
from planner.spec import JobSpec
from tests.api.conftest import BOX, job_spec

DATA = Path(__file__).resolve().parents[1] / "data" / "llamafactory"
DS_FILES = sorted(DATA.glob("ds_*.json"))
YAMLS = sorted(DATA.glob("*.yaml"))
WHAT_IF = {"gpu_count": 2, "gpu_memory_bytes": 80 * 2**30, "host_memory_bytes": 256 * 2**30}


def _ds(name: str) -> dict[str, Any]:
    return dict(json.loads((DATA / name).read_text()))


def _plan(env: Any, spec: dict[str, Any]) -> Any:
    return env.client.post("/v1/plans", json=spec, headers=env.auth())


@pytest.mark.parametrize("path", DS_FILES, ids=[p.stem for p in DS_FILES])
def test_llamafactorys_deepspeed_configs_plan_as_they_are(pg_env, path):
    config = json.loads(path.read_text())
    res = _plan(pg_env, job_spec(resources={"deepspeed": config}, hardware=BOX))
    assert res.status_code == 200, res.text
    plan, zero = res.json(), config["zero_optimization"]
    assert plan["resolved"]["zero_stage"] == zero["stage"]
    for target in ("offload_optimizer", "offload_param"):
        assert plan["resolved"][target] == zero.get(target, {}).get("device", plan["resolved"][target])
    generated = plan["deepspeed_config"]["zero_optimization"]
    pinned = ("sub_group_size", "stage3_max_live_parameters", "overlap_comm") if zero["stage"] else ()
    for key, value in zero.items():  # pinned knobs reach the generated config; "auto" is the planner's
        if key in pinned and value != "auto":
            assert generated[key] == value, key


def test_the_zero_block_alone_with_auto_values_plans(pg_env):
    zero = _ds("ds_z3_offload_config.json")["zero_optimization"]
    res = _plan(pg_env, job_spec(resources={"deepspeed": zero}, hardware=BOX))
    assert res.status_code == 200, res.text
    assert res.json()["deepspeed_config"]["zero_optimization"]["sub_group_size"] == 10**9


def test_batch_fields_fill_the_spec_and_a_contradiction_names_both(pg_env):
    config = {
        **_ds("ds_z2_config.json"),
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
    }
    res = _plan(pg_env, job_spec(resources={"deepspeed": config}, hardware=BOX))
    assert res.status_code == 200, res.text
    resolved = res.json()["resolved"]
    assert (resolved["micro_batch_size"], resolved["gradient_accumulation_steps"]) == (2, 4)
    res = _plan(
        pg_env,
        job_spec(
            resources={"deepspeed": config},
            hardware=BOX,
            training={"max_steps": 10, "seq_len": 512, "micro_batch_size": 8},
        ),
    )
    assert res.status_code == 422
    fields = {e["field"] for e in res.json()["errors"]}
    assert fields == {"training.micro_batch_size", "resources.deepspeed.train_micro_batch_size_per_gpu"}
    total = {**_ds("ds_z2_config.json"), "train_batch_size": 32}
    training = {"max_steps": 10, "seq_len": 512, "gradient_accumulation_steps": 8}
    res = _plan(
        pg_env, job_spec(resources={"deepspeed": total, "num_gpus": 1}, hardware=BOX, training=training)
    )
    assert res.status_code == 200, res.text
    assert res.json()["resolved"]["micro_batch_size"] == 4  # 32 = 4 x 8 x 1 GPU
    res = _plan(
        pg_env,
        job_spec(
            resources={"deepspeed": total, "num_gpus": 1},
            hardware=BOX,
            training={
                "max_steps": 10,
                "seq_len": 512,
                "micro_batch_size": 2,
                "gradient_accumulation_steps": 8,
            },
        ),
    )
    assert res.status_code == 422
    assert {e["field"] for e in res.json()["errors"]} == {
        "resources.deepspeed.train_batch_size",
        "training.micro_batch_size",
    }


def test_precision_and_settings_tunebox_generates(pg_env):
    config = {**_ds("ds_z0_config.json"), "bf16": {"enabled": True}}
    res = _plan(
        pg_env,
        job_spec(
            resources={"deepspeed": config},
            hardware=BOX,
            training={"max_steps": 10, "seq_len": 512, "precision": "fp16"},
        ),
    )
    assert res.status_code == 422
    assert {e["field"] for e in res.json()["errors"]} == {
        "training.precision",
        "resources.deepspeed.bf16.enabled",
    }
    auto_optimizer = {
        **config,
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    }
    assert _plan(pg_env, job_spec(resources={"deepspeed": auto_optimizer}, hardware=BOX)).status_code == 200
    fixed = {**config, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    res = _plan(pg_env, job_spec(resources={"deepspeed": fixed}, hardware=BOX))
    assert res.status_code == 422 and res.json()["errors"][0]["field"] == "resources.deepspeed.optimizer"
    odd = {**config, "pipeline": {"stages": 2}}
    res = _plan(pg_env, job_spec(resources={"deepspeed": odd}, hardware=BOX))
    assert res.status_code == 422 and res.json()["errors"][0]["field"] == "resources.deepspeed.pipeline"


def _converted(path: Path) -> Any:
    # the examples train on two of LLaMA-Factory's bundled datasets; tunebox takes one file
    config = {**yaml.safe_load(path.read_text()), "dataset": "identity"}
    ds = _ds(Path(config["deepspeed"]).name) if config.get("deepspeed") else None
    return config, convert(config, deepspeed=ds)


@pytest.mark.parametrize("path", YAMLS, ids=[p.stem for p in YAMLS])
def test_llamafactorys_example_yamls_convert_and_plan(pg_env, path):
    config, converted = _converted(path)
    spec = converted.spec
    JobSpec.model_validate(spec)
    assert spec["model"]["path"] == config["model_name_or_path"]
    assert spec["training"]["seq_len"] == config["cutoff_len"]
    assert spec["training"]["micro_batch_size"] == config["per_device_train_batch_size"]
    assert spec["training"]["epochs"] == config["num_train_epochs"]
    lora = "qlora" if config.get("quantization_bit") else "lora"
    assert spec["method"] == {"full": "full", "lora": lora}[config["finetuning_type"]]
    if spec["method"] != "full":
        assert spec["lora"]["r"] == config["lora_rank"] and spec["lora"]["target_modules"] == ["all-linear"]
    taken = {
        "model_name_or_path",
        "finetuning_type",
        "lora_rank",
        "lora_target",
        "cutoff_len",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "learning_rate",
        "num_train_epochs",
        "dataset",
        "deepspeed",
        "quantization_bit",
        "quantization_method",
    }
    left = set(config) - taken
    assert set(converted.unmapped) <= left
    assert {"template", "output_dir"} <= set(converted.unmapped)
    assert all(converted.unmapped.values())  # each with its reason
    assert spec["dataset"] == {"path": "data/identity", "format": "auto"}
    plannable = {**spec, "model": {"name": "Qwen/Qwen2.5-3B"}, "hardware": WHAT_IF}
    plannable.pop("dataset")
    res = _plan(pg_env, plannable)
    assert res.status_code == 200, res.text
    if config.get("deepspeed"):
        assert res.json()["resolved"]["zero_stage"] == 3


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"stage": "dpo"}, "stage"),
        ({"quantization_bit": 8}, "quantization_bit"),
        ({"dataset": "identity,alpaca_en_demo"}, "dataset"),
        ({"finetuning_type": "freeze"}, "finetuning_type"),
        ({"eval_dataset": "a,b"}, "eval_dataset"),
    ],
)
def test_what_tunebox_cannot_honour_is_refused_by_name(change, field):
    config = {**yaml.safe_load((DATA / "qwen3_lora_sft.yaml").read_text()), "dataset": "identity", **change}
    with pytest.raises(PlanError) as err:
        convert(config)
    assert err.value.field == field


def test_an_eval_dataset_is_the_jobs_evaluation_rows():
    config = {**yaml.safe_load((DATA / "qwen3_lora_sft.yaml").read_text()), "dataset": "identity",
              "eval_dataset": "held", "dataset_dir": "mydata"}
    config.pop("val_size", None)
    info = {"identity": {"file_name": "identity.json"},
            "held": {"file_name": "held.jsonl", "formatting": "sharegpt"}}
    converted = convert(config, dataset_info=info)
    assert converted.spec["eval"]["dataset"] == {"path": "mydata/held.jsonl", "format": "sharegpt"}
    assert "eval_dataset" not in converted.unmapped
    spec = JobSpec.model_validate(converted.spec)
    assert spec.dataset is not None and spec.dataset.eval_fraction == 0.0
    with pytest.raises(ValueError, match="give one"):  # LLaMA-Factory's val_size beside it contradicts it
        JobSpec.model_validate(convert({**config, "val_size": 0.1}, dataset_info=info).spec)
