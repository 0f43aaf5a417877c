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
from tests.tinymodel import merge_generations
from tests.worker_train import planned
from tests.worker_train.planned import Mode, spec_of
from tunebox.export import is_adapter, merge

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_qlora_trains_on_the_gpu_and_its_adapter_merges_into_the_bf16_base(tmp_path: Path,
                                                                            tiny_model: Path) -> None:
    pytest.importorskip("bitsandbytes")
    import torch

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
    merged, ours, theirs, untouched = merge_generations(tmp_path / "merged", tiny_model, adapter, "cuda")
    assert merged.dtype == torch.bfloat16 and not hasattr(merged, "peft_config")
    assert ours == theirs
    assert ours != untouched  # the adapter changed what the model says
