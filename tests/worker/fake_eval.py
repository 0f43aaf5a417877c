"""A stand-in evaluation process (``TUNEBOX_EVAL_MODULE``): writes ``DIR/eval/<name>.json``.

A spec name containing ``eval-crash`` dies by SIGKILL without a result; ``eval-oom`` reports a
CUDA OOM the way the real evaluation does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    args = parser.parse_args()
    name = json.loads((args.job_dir / "run.json").read_text())["spec"]["name"]
    out = args.job_dir / "eval" / f"{args.checkpoint.name}.json"
    if "eval-crash" in name:
        os.kill(os.getpid(), signal.SIGKILL)
    if "eval-oom" in name:
        out.write_text(json.dumps({"status": "failed", "kind": "error", "reason": "cuda_oom",
                                   "message": "CUDA out of memory", "pid": os.getpid()}))
        return 3
    out.write_text(json.dumps({"status": "ok", "pid": os.getpid(), "checkpoint": str(args.checkpoint),
                               "eval_loss": 1.25, "perplexity": 3.49, "samples": []}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
