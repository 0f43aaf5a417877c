"""QLoRA on an NVIDIA GPU (``gpu`` marker), as the worker runs it and as a user takes it out.

The training process, started with the run file and environment the worker gives a leased card,
loads the base in 4 bits (bitsandbytes NF4), trains the adapter until its loss falls and saves it;
``tunebox export --merge``'s merge then writes a bf16 model that generates what the bf16 base with
the adapter generates, and not what the base alone generates.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean

import pytest

from tests.tinydata import write_dataset
from tests.worker_train import planned
from tests.worker_train.planned import Mode, spec_of
from tunebox.export import is_adapter, merge

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_qlora_trains_on_the_gpu_and_its_adapter_merges_into_the_bf16_base(tmp_path: Path,
                                                                            tiny_model: Path) -> None:
    pytest.importorskip("bitsandbytes")
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = write_dataset(tmp_path / "alpaca.jsonl", "alpaca", n=24)
    grant = planned.gpu_grant(planned.nvml_uuids()[:1])
    spec = spec_of(Mode(0, "bf16", "adamw", "qlora", 1e-2, steps=12), tiny_model, data)
    job_dir = tmp_path / "job"
    assert planned.train_alone(job_dir, grant, spec) == 0, planned.log_tail(job_dir)
    events = planned.progress(job_dir)
    assert events[-1]["type"] == "done", planned.log_tail(job_dir)
    losses = planned.losses(job_dir)
    assert len(losses) == 12 and mean(losses[-3:]) < mean(losses[:3])
    adapter = Path(events[-1]["final_path"])
    assert is_adapter(adapter)

    merge(adapter, tiny_model, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").cuda()
    assert merged.dtype == torch.bfloat16 and not hasattr(merged, "peft_config")
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
    adapted = PeftModel.from_pretrained(base, str(adapter))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).cuda()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    prompt = tokenizer("Repeat the word: river", return_tensors="pt").to("cuda")
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        ours = merged.generate(**prompt, **settings)
        theirs = adapted.generate(**prompt, **settings)
        untouched = plain.generate(**prompt, **settings)
    assert ours.tolist() == theirs.tolist()
    assert ours.tolist() != untouched.tolist()  # the adapter changed what the model says
