"""bench/libaio.py: Debian's libaio packages unpacked into a prefix make DeepSpeed's async I/O op
builder find libaio where the system has no headers."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from bench.libaio import LIBDIR, VENDOR, check, environment, unpack


def test_the_vendored_packages_unpack_into_headers_and_libraries(tmp_path: Path) -> None:
    debs = sorted(VENDOR.glob("*.deb"))
    assert [d.name.split("_")[0] for d in debs] == ["libaio-dev", "libaio1"]
    for deb in debs:
        unpack(deb, tmp_path)
    assert "io_submit" in (tmp_path / "usr/include/libaio.h").read_text()
    lib = ctypes.CDLL(str(tmp_path / LIBDIR / "libaio.so"))
    assert hasattr(lib, "io_submit") and hasattr(lib, "io_setup")


def test_deepspeeds_op_builder_finds_the_unpacked_libaio(tmp_path: Path) -> None:
    if check({}).get("compatible"):
        pytest.skip("this machine has libaio's headers already")
    for deb in sorted(VENDOR.glob("*.deb")):
        unpack(deb, tmp_path)
    result = check(environment(tmp_path))
    assert result.get("compatible") is True, result
