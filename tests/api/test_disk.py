"""The box's free disk where job folders live is in every plan; checkpoints it cannot hold are refused."""

from __future__ import annotations

import shutil

from tests.api.conftest import Env, job_spec


def test_a_plan_on_the_box_counts_its_checkpoints_against_the_job_disk(env: Env) -> None:
    res = env.client.post("/v1/plans", json=job_spec(), headers=env.auth())
    assert res.status_code == 200, res.text
    disk = res.json()["disk"]
    free = shutil.disk_usage(env.settings.data_dir if env.settings.data_dir.exists() else "/").free
    assert abs(disk["free_bytes"] - free) < 2**30  # the same disk, a moment apart
    assert disk["fits"] and 0 < disk["checkpoint_bytes"] <= disk["total_bytes"]


def test_a_job_whose_checkpoints_the_disk_cannot_hold_is_refused_before_it_queues(env: Env) -> None:
    free = shutil.disk_usage(env.settings.data_dir if env.settings.data_dir.exists() else "/").free
    res = env.client.post("/v1/plans", json=job_spec(), headers=env.auth())
    one = res.json()["disk"]["checkpoint_bytes"]
    saves = free // one + 2  # more saves of the tiny model's full checkpoint than the disk holds
    spec = job_spec(method="full", training={"max_steps": saves, "seq_len": 512, "save_steps": 1,
                                             "save_total_limit": None})
    refused = env.client.post("/v1/jobs", json=spec, headers=env.auth())
    assert refused.status_code == 422, refused.text
    assert "insufficient_disk" in refused.text and "training.save_total_limit" in refused.text
    assert env.enqueued.calls == []
