"""``python -m worker.train`` that, once trained, also writes the trained model's logits.

The training is the service's own (``worker.train.main``, every rank); after ``fit`` each rank runs
the engine's model on the first training example and rank 0 saves ``{"input_ids", "logits"}`` to
``DIR/probe.pt``, so a test can check that the checkpoint reloads to the model that was trained.
Used as ``TUNEBOX_TRAIN_MODULE``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from worker import train

PROBE_FILE = "probe.pt"
_fit = train.Trainer.fit


def _fit_and_probe(self: train.Trainer) -> int:
    code = _fit(self)
    import torch

    ids = torch.tensor([self.examples[0].input_ids], dtype=torch.long, device=self.engine.device)
    self.engine.eval()
    with torch.no_grad():  # a collective under ZeRO-3: every rank runs it
        logits: Any = self.engine.module(input_ids=ids, use_cache=False).logits
    if self.is_rank0:
        torch.save({"input_ids": ids.cpu(), "logits": logits.float().cpu()}, self.run.job_dir / PROBE_FILE)
    return code


train.Trainer.fit = _fit_and_probe  # type: ignore[method-assign]

if __name__ == "__main__":
    code = train.main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
