"""libaio for DeepSpeed's async I/O op (NVMe offload) on a box whose image has none and no package
index: unpacks Debian's ``libaio1`` and ``libaio-dev`` packages (bench/vendor/libaio, from Debian 12,
``apt-get download libaio1 libaio-dev``) into a prefix without dpkg or root, and prints the
environment that points the op builder's compile check, its build and the loader at it.

    eval "$(python3 -m bench.libaio .cache/libaio)"     # then: tunebox serve / worker, bench runs
    python3 -m bench.libaio .cache/libaio --check       # does DeepSpeed's op builder see it?
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parent / "vendor" / "libaio"
LIBDIR = "usr/lib/x86_64-linux-gnu"


def _ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an ``ar`` archive (a .deb is one)."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    members, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size % 2)
    return members


def unpack(deb: Path, prefix: Path) -> None:
    members = _ar_members(deb.read_bytes())
    name = next(n for n in members if n.startswith("data.tar"))
    with tarfile.open(fileobj=io.BytesIO(members[name])) as tar:
        tar.extractall(prefix, filter="tar")


def environment(prefix: Path) -> dict[str, str]:
    """CFLAGS/LDFLAGS for the op builder's ``has_function`` check, CPATH/LIBRARY_PATH for the
    JIT build's compiler and linker, LD_LIBRARY_PATH for loading the built op."""
    include, lib = prefix / "usr" / "include", prefix / LIBDIR

    def joined(var: str, value: Path, sep: str = ":") -> str:
        old = os.environ.get(var)
        return f"{value}{sep}{old}" if old else str(value)

    return {
        "CFLAGS": f"-I{include} " + os.environ.get("CFLAGS", ""),
        "LDFLAGS": f"-L{lib} " + os.environ.get("LDFLAGS", ""),
        "CPATH": joined("CPATH", include),
        "LIBRARY_PATH": joined("LIBRARY_PATH", lib),
        "LD_LIBRARY_PATH": joined("LD_LIBRARY_PATH", lib),
    }


CHECK = (
    "import json\n"
    "from deepspeed.accelerator import get_accelerator\n"
    "b = get_accelerator().create_op_builder('AsyncIOBuilder')\n"
    "ok = bool(b and b.is_compatible())\n"
    "print(json.dumps({'accelerator': get_accelerator()._name, 'compatible': ok}))\n"
)


def check(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env={**os.environ, **env}, check=False
    )
    if done.returncode != 0:
        return {"compatible": False, "error": done.stderr.strip()[-500:]}
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefix", type=Path)
    parser.add_argument("--check", action="store_true", help="ask DeepSpeed's op builder, print JSON")
    args = parser.parse_args()
    prefix = args.prefix.resolve()
    for deb in sorted(VENDOR.glob("*.deb")):
        unpack(deb, prefix)
    env = environment(prefix)
    if args.check:
        print(json.dumps({"prefix": str(prefix), **check(env)}))
        return 0
    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
