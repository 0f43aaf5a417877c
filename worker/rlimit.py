"""``python -m worker.rlimit --address-space BYTES -- PROGRAM ARGS...``: run a program under a cap.

The launcher starts a job's processes through this when ``job_address_space_bytes`` is set. The
limit is set here, in the new process, and the program is exec'd in its place (same pid, same
process group, same environment), because ``preexec_fn`` is unsafe in the threaded worker.
An allocation past the cap fails inside the program (``MemoryError``, or torch's "can't allocate
memory"), which the training reports as ``host_oom``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.rlimit")
    parser.add_argument("--address-space", type=int, required=True, help="RLIMIT_AS in bytes")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no program to run")
    resource.setrlimit(resource.RLIMIT_AS, (args.address_space, args.address_space))
    os.execv(command[0], command)
    return 127  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(main())
