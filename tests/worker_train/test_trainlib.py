"""Tokenisation/masking, split, data order and LR schedule of the training process (in-process, fast)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from tests.tinydata import ROWS, write_dataset
from tunebox.datasets import load_records
from worker._trainlib import checkpoint as ckpt
from worker._trainlib.data import (
    IGNORE,
    MicroBatchOrder,
    collate,
    encode,
    eval_size,
    read_eval_split,
    render_prompt,
    split_rows,
    total_steps,
    write_eval_split,
)
from worker._trainlib.runfile import classify
from worker._trainlib.schedule import lr_factor, warmup_steps

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Repeat the word: apple"},
        {"role": "assistant", "content": "apple apple apple"}, {"role": "user", "content": "again"},
        {"role": "assistant", "content": "apple"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model), local_files_only=True)


@pytest.fixture(scope="module")
def plain_tokenizer(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    return tok


def _learned_text(tok, example) -> str:
    return tok.decode([t for t in example.labels if t != IGNORE])


def test_chat_template_masks_everything_but_answers(tokenizer) -> None:
    example = encode(tokenizer, CHAT, "sharegpt", 256)
    assert example is not None and len(example.labels) == len(example.input_ids)
    assert _learned_text(tokenizer, example).replace("\n", "") == "apple apple apple</s>apple</s>"
    assert "Repeat" in tokenizer.decode(example.input_ids)


def test_plain_template_without_chat_template(plain_tokenizer) -> None:
    example = encode(plain_tokenizer, CHAT[1:3], "alpaca", 256)
    text = plain_tokenizer.decode(example.input_ids)
    assert "### Instruction:" in text and "### Response:" in text
    assert _learned_text(plain_tokenizer, example) == "apple apple apple</s>"
    prompt, reference = render_prompt(plain_tokenizer, CHAT[1:3], "alpaca")
    assert prompt.endswith("### Response:\n") and reference == "apple apple apple"


def test_text_rows_learn_every_token(tokenizer) -> None:
    example = encode(tokenizer, [{"role": "assistant", "content": "once upon a time"}], "text", 256)
    assert all(t != IGNORE for t in example.labels[1:])
    assert example.labels[0] == IGNORE  # the BOS token is context, not a target


def test_truncation_and_rows_without_answers(tokenizer) -> None:
    full = encode(tokenizer, CHAT, "sharegpt", 256)
    first_answer = next(i for i, t in enumerate(full.labels) if t != IGNORE)
    cut = first_answer + 3
    example = encode(tokenizer, CHAT, "sharegpt", cut)
    assert example is not None and example.input_ids == full.input_ids[:cut] and example.num_targets == 3
    long_prompt = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "yes"}]
    assert encode(tokenizer, long_prompt, "sharegpt", 32) is None


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_every_format_encodes(tmp_path: Path, tokenizer, kind: str) -> None:
    fmt, rows = load_records(write_dataset(tmp_path / "d.jsonl", kind, n=4))
    for row in rows:
        example = encode(tokenizer, row, fmt, 64)
        assert example is not None and example.num_targets >= 3


def test_collate_pads_right_and_ignores_padding(tokenizer) -> None:
    a, b = encode(tokenizer, CHAT[1:3], "sharegpt", 64), encode(tokenizer, CHAT, "sharegpt", 64)
    batch = collate([a, b], pad=0)
    width = len(b.input_ids)
    assert all(len(row) == width for key in batch for row in batch[key])
    gap = width - len(a.input_ids)
    assert batch["labels"][0][-gap:] == [IGNORE] * gap and batch["attention_mask"][0][-gap:] == [0] * gap


def test_eval_split_is_deterministic_and_never_empty() -> None:
    rows = [[{"role": "assistant", "content": str(i)}] for i in range(20)]
    assert eval_size(20, 0.0) == 0 and eval_size(1, 0.5) == 0 and eval_size(2, 0.01) == 1
    train, evals = split_rows(rows, 0.1, seed=3)
    assert len(evals) == 2 and len(train) == 18 and not {id(r) for r in train} & {id(r) for r in evals}
    assert split_rows(rows, 0.1, seed=3)[1] == evals and split_rows(rows, 0.1, seed=4)[1] != evals


def test_eval_split_round_trip(tmp_path: Path) -> None:
    write_eval_split(tmp_path / "e.jsonl", [CHAT], "sharegpt")
    assert read_eval_split(tmp_path / "e.jsonl") == [("sharegpt", {"messages": CHAT})]
    assert read_eval_split(tmp_path / "absent.jsonl") == []


def test_micro_batch_order_is_a_function_of_k_and_covers_each_epoch() -> None:
    order = MicroBatchOrder(10, micro_batch_size=2, world_size=2, rank=0, seed=1)
    other = MicroBatchOrder(10, micro_batch_size=2, world_size=2, rank=1, seed=1)
    assert order.per_epoch == 3
    epoch0 = [i for k in range(3) for i in order.indices(k) + other.indices(k)]
    assert set(epoch0) == set(range(10)) and len(epoch0) == 12  # two wrapped to fill the last batch
    assert MicroBatchOrder(10, 2, 2, 0, 1).indices(4) == order.indices(4)
    assert order.indices(3) != order.indices(0) or order.indices(4) != order.indices(1)
    assert total_steps(order, 2, epochs=2, max_steps=None) == 3 and total_steps(order, 2, 2, 7) == 7


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_lr_schedule(kind: str) -> None:
    f = lr_factor(kind, total=10, warmup=warmup_steps(10, 0.2))
    assert [round(f(s), 3) for s in (0, 1)] == [0.333, 0.667]
    assert f(2) == 1.0
    assert 0 <= f(9) < (1.0 if kind != "constant" else 1.01)
    if kind != "constant":
        assert f(9) < f(5) < f(2)


class _FullDiskEngine:
    def save_checkpoint(self, path: str, **_: object) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "half-written").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")


def test_checkpoint_on_full_disk_leaves_nothing_and_says_disk_full(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    with pytest.raises(OSError) as info:
        ckpt.save(_FullDiskEngine(), None, root, 3, {"step": 3}, lora=True, is_rank0=True)
    assert list(root.iterdir()) == []
    failure = classify(info.value)
    assert (failure.kind, failure.reason, failure.exit_code) == ("error", "disk_full", 5)
    assert ckpt.latest_complete(root) is None


def test_latest_complete_ignores_partials(tmp_path: Path) -> None:
    for name in ("step-2", "step-10", ".tmp-step-12", "step-11"):
        (tmp_path / name).mkdir()
    for name in ("step-2", "step-10"):
        (tmp_path / name / ckpt.STATE_FILE).write_text('{"step": 1}')
    assert ckpt.latest_complete(tmp_path).path.name == "step-10"
    ckpt.remove_partials(tmp_path)
    assert not (tmp_path / ".tmp-step-12").exists()


@pytest.mark.parametrize(("exc", "reason", "code"), [
    ("cuda", "cuda_oom", 3), (MemoryError(), "host_oom", 4), (OSError(errno.ENOSPC, "full"), "disk_full", 5),
    (RuntimeError("boom"), "error", 1),
])
def test_exceptions_map_to_reasons_and_exit_codes(exc: object, reason: str, code: int) -> None:
    if exc == "cuda":
        import torch

        exc = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    failure = classify(exc)  # type: ignore[arg-type]
    assert (failure.kind, failure.reason, failure.exit_code) == ("error", reason, code)


def test_run_file_falls_back_to_the_spec_and_names_a_missing_model(tmp_path: Path, tiny_model: Path) -> None:
    from tests.worker_train.conftest import make_spec, write_run
    from worker._trainlib.runfile import JobFailure, load_run

    job = write_run(tmp_path / "job", make_spec(tiny_model, tmp_path / "d.jsonl", precision="bf16"))
    raw = json.loads((job / "run.json").read_text())
    raw["resolved"] = {"micro_batch_size": None, "precision": None}
    raw["model_path"] = ""
    (job / "run.json").write_text(json.dumps(raw))
    run = load_run(job)
    assert (run.resolved.micro_batch_size, run.resolved.precision, run.resolved.zero_stage) == (4, "bf16", 3)
    with pytest.raises(JobFailure) as info:
        _ = run.model_dir
    assert (info.value.kind, info.value.reason) == ("user_error", "bad_model")
    (job / "run.json").write_text("{")
    with pytest.raises(JobFailure) as bad:
        load_run(job)
    assert bad.value.reason == "bad_run_file"


def test_run_file_carries_the_gpu_memory_limit(tmp_path: Path, tiny_model: Path) -> None:
    from tests.worker_train.conftest import make_spec, write_run
    from worker._trainlib.runfile import JobFailure, load_run

    job = write_run(tmp_path / "job", make_spec(tiny_model, tmp_path / "d.jsonl"))
    assert load_run(job).gpu_memory_limit_bytes is None  # absent: no limit
    raw = json.loads((job / "run.json").read_text())
    for value, expected in ((123_456_789, 123_456_789), (None, None), (-5, "bad"), ("x", "bad")):
        (job / "run.json").write_text(json.dumps({**raw, "gpu_memory_limit_bytes": value}))
        if expected == "bad":
            with pytest.raises(JobFailure) as bad:
                load_run(job)
            assert bad.value.reason == "bad_run_file"
        else:
            assert load_run(job).gpu_memory_limit_bytes == expected


def test_run_file_carries_the_loss_chunk_the_plan_resolved(tmp_path: Path, tiny_model: Path) -> None:
    from tests.worker_train.conftest import make_spec, write_run
    from worker._trainlib.runfile import load_run

    spec = make_spec(tiny_model, tmp_path / "d.jsonl")
    spec["training"]["loss_chunk_tokens"] = "auto"
    job = write_run(tmp_path / "job", spec)
    raw = json.loads((job / "run.json").read_text())
    assert load_run(job).resolved.loss_chunk_tokens is None  # "auto" the plan did not resolve: full logits
    for resolved, expected in ((1024, 1024), (None, None)):
        raw["resolved"]["loss_chunk_tokens"] = resolved
        (job / "run.json").write_text(json.dumps(raw))
        assert load_run(job).resolved.loss_chunk_tokens == expected
    spec["training"]["loss_chunk_tokens"] = 64  # a run file without the field: the spec's own chunk
    raw["spec"] = spec
    raw["resolved"] = {k: v for k, v in raw["resolved"].items() if k != "loss_chunk_tokens"}
    (job / "run.json").write_text(json.dumps(raw))
    assert load_run(job).resolved.loss_chunk_tokens == 64


def test_an_oom_under_the_limit_names_the_plan_it_was_held_to(tmp_path: Path) -> None:
    import types

    import torch

    from worker import train

    exc = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 14.24 GiB")
    held = types.SimpleNamespace(run=types.SimpleNamespace(device="cuda", gpu_memory_limit_bytes=3 * 2**30),
                                 is_rank0=True)
    assert train._fail(tmp_path, exc, held) == 3  # type: ignore[arg-type]
    failure = json.loads((tmp_path / "failure.json").read_text())
    assert failure["reason"] == "cuda_oom" and "PyTorch was held to 3.00 GiB per GPU" in failure["message"]
    # the figures the worker plans the job again with: the limit, and the request that failed
    assert failure["data"]["gpu_memory_limit_bytes"] == 3 * 2**30
    assert failure["data"]["requested_bytes"] == int(14.24 * 2**30)
    free = types.SimpleNamespace(run=types.SimpleNamespace(device="cuda", gpu_memory_limit_bytes=None),
                                 is_rank0=True)
    train._fail(tmp_path, exc, free)  # type: ignore[arg-type]
    assert "held to" not in json.loads((tmp_path / "failure.json").read_text())["message"]


def test_the_model_is_loaded_with_the_attention_its_plan_was_made_for(tmp_path: Path) -> None:
    """The plan resolves the attention (Gemma 2: eager, whose memory it counts; the rest: SDPA) and
    the run file carries it, so the trainer and the evaluator load the model with it whatever
    transformers would pick (5.17 gave Gemma 2 SDPA, 30% under the eager plan); a run file without
    it falls back to the spec's, and to transformers' choice."""
    from planner import plan
    from worker import launcher
    from worker._trainlib.modeling import attention_kwargs
    from worker._trainlib.runfile import RunConfig, load_run

    def run_file(model_type: str, **training: object) -> RunConfig:
        config = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 128,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                  "vocab_size": 128}
        spec = {"model": {"config": config}, "method": "lora", "training": training,
                "hardware": {"gpu_count": 1, "gpu_memory_bytes": 2**34, "host_memory_bytes": 2**36}}
        resolved = plan(spec).resolved.model_dump()
        raw = {"job_id": "job_x", "spec": {**spec, "model": {"path": "/models/x"}},
               "resolved": {k: resolved[k] for k in launcher.RESOLVED_KEYS}, "deepspeed_config": {},
               "device": "cpu"}
        (tmp_path / "run.json").write_text(json.dumps(raw))
        return load_run(tmp_path)

    gemma = run_file("gemma2")
    assert attention_kwargs(gemma.resolved.attn_implementation) == {"attn_implementation": "eager"}
    assert attention_kwargs(run_file("llama").resolved.attn_implementation) == {"attn_implementation": "sdpa"}
    named = run_file("gemma2", attn_implementation="sdpa")
    assert attention_kwargs(named.resolved.attn_implementation) == {"attn_implementation": "sdpa"}
    assert attention_kwargs(None) == {}


def test_an_attention_transformers_cannot_run_for_the_model_is_the_jobs_error(tmp_path: Path) -> None:
    """Gemma 2 without a named attention loads (transformers picks eager); naming SDPA, which
    transformers 5.24 refuses for it, is a user error that names the field."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from worker._trainlib.modeling import load_causal_lm
    from worker._trainlib.runfile import USER_ERROR, JobFailure

    config = AutoConfig.for_model("gemma2", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=128)
    AutoModelForCausalLM.from_config(config, attn_implementation="eager").save_pretrained(tmp_path)
    model = load_causal_lm(tmp_path, torch.bfloat16)
    assert model.config._attn_implementation == "eager"
    try:
        load_causal_lm(tmp_path, torch.bfloat16, attn_implementation="sdpa")
    except JobFailure as failure:
        assert (failure.kind, failure.reason) == (USER_ERROR, "attn_unavailable")
        assert "training.attn_implementation sdpa" in failure.message
    else:  # a transformers that runs SDPA for Gemma 2 (5.17 did) loads it
        pytest.skip("this transformers runs SDPA for Gemma 2")
