"""``python -m worker.prebuild OP...``: build (or load) DeepSpeed's ops before any job needs them.

A worker runs this in the background when it starts, in the environment its training processes get
(the same extensions cache and arch list), so the first job on a fresh box loads the ops instead of
waiting minutes for their build. One line per op: ``OP: ready in S s``, ``OP: skipped (why)`` or
``OP: failed (why)``; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import sys
import time

#: the op's name (its folder in the extensions cache) -> DeepSpeed's builder class
BUILDERS = {
    "cpu_adam": "CPUAdamBuilder",
    "fused_adam": "FusedAdamBuilder",
    "cpu_lion": "CPULionBuilder",
    "fused_lion": "FusedLionBuilder",
    "async_io": "AsyncIOBuilder",
}


def prebuild(op: str) -> str:
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    try:
        builder = accelerator.create_op_builder(BUILDERS[op])
    except (AttributeError, ValueError):
        builder = None
    if builder is None:
        return f"{op}: skipped (the {accelerator.device_name()} accelerator has no such op)"
    if not builder.is_compatible(verbose=False):
        return f"{op}: skipped (not buildable on this box)"
    start = time.monotonic()
    try:
        builder.load(verbose=False)
    except Exception as exc:  # a build error is the job's to report when it needs the op
        return f"{op}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''})"
    return f"{op}: ready in {time.monotonic() - start:.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ops", nargs="+", choices=sorted(BUILDERS))
    args = parser.parse_args(argv)
    failed = False
    for op in args.ops:
        line = prebuild(op)
        failed = failed or ": failed" in line
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
