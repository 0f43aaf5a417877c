"""The evaluation process's loss, computed a few positions at a time."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from worker._trainlib.data import IGNORE  # noqa: E402
from worker.evaluate import summed_loss  # noqa: E402


def test_the_loss_over_chunks_of_positions_is_the_loss_over_the_whole_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 37, 101, generator=generator).to(torch.bfloat16)
    labels = torch.randint(0, 101, (3, 37), generator=generator)
    labels[0, :10] = IGNORE  # a prompt's positions carry no loss
    labels[2, 30:] = IGNORE  # nor does padding
    whole = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, 101),
                                              labels[:, 1:].reshape(-1), ignore_index=IGNORE, reduction="sum")
    counted = int((labels[:, 1:] != IGNORE).sum())
    for chunk in (1, 5, 36, 37, 1000):
        total, count = summed_loss(logits, labels, chunk=chunk)
        assert count == counted == 3 * 36 - 9 - 7
        assert total == pytest.approx(float(whole), rel=1e-5), chunk
    # the logits stay in their dtype: only a chunk is upcast at a time
    assert logits.dtype == torch.bfloat16
