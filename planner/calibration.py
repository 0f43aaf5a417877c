"""The estimator's constants as data: ``planner/data/calibration.json``.

Each constant carries its value, unit, kind (measured, fitted, count, setting, datasheet), the
hardware it came from and the records under ``bench/results`` behind it. ``planner.constants``
exposes the values by name; a fitter plans with other values through :func:`trial`, never by
writing the module's attributes itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

KINDS = ("measured", "fitted", "count", "setting", "datasheet")


@dataclass(frozen=True)
class Constant:
    name: str
    value: float | int | tuple[float, ...]
    unit: str
    kind: str
    meaning: str
    hardware: str | None
    records: tuple[str, ...]
    basis: str


@dataclass(frozen=True)
class Structure:
    """A term of the estimator that no constant carries (a byte formula from how the libraries lay
    memory out), with the records that showed it was missing: those records shaped the planner."""

    name: str
    meaning: str
    records: tuple[str, ...]
    basis: str


@dataclass(frozen=True)
class Calibration:
    constants: Mapping[str, Constant]
    #: the measurement files the fitted constants were fitted on; every other record is held out
    calibration_files: tuple[str, ...]
    structure: tuple[Structure, ...] = ()

    def shaping_records(self) -> frozenset[str]:
        """Every file or job (``file:phase:job``) under bench/results that a constant or a
        structural term was built on: records that can no longer test the planner."""
        named = {r for c in self.constants.values() for r in c.records}
        return frozenset(named | {r for s in self.structure for r in s.records})

    def __getitem__(self, name: str) -> Constant:
        return self.constants[name]

    def whole(self, name: str) -> int:
        value = self.constants[name].value
        if not isinstance(value, int):
            raise TypeError(f"calibration constant {name} is not a whole number")
        return value

    def real(self, name: str) -> float:
        value = self.constants[name].value
        if isinstance(value, tuple):
            raise TypeError(f"calibration constant {name} is a range")
        return float(value)

    def bounds(self, name: str) -> tuple[float, float]:
        value = self.constants[name].value
        if not isinstance(value, tuple) or len(value) != 2:
            raise TypeError(f"calibration constant {name} is not a (low, high) pair")
        return float(value[0]), float(value[1])


def _constant(name: str, raw: Mapping[str, Any]) -> Constant:
    if raw["kind"] not in KINDS:
        raise ValueError(f"calibration constant {name}: kind must be one of {', '.join(KINDS)}")
    value = raw["value"]
    return Constant(name=name, value=tuple(value) if isinstance(value, list) else value, unit=raw["unit"],
                    kind=raw["kind"], meaning=raw["meaning"], hardware=raw.get("hardware"),
                    records=tuple(raw.get("records") or ()), basis=raw.get("basis") or "")


def parse(raw: Mapping[str, Any]) -> Calibration:
    structure = tuple(Structure(name=n, meaning=s["meaning"], records=tuple(s["records"]), basis=s["basis"])
                      for n, s in (raw.get("structure") or {}).items())
    return Calibration(constants={n: _constant(n, c) for n, c in raw["constants"].items()},
                       calibration_files=tuple(raw["calibration_files"]), structure=structure)


def load() -> Calibration:
    text = resources.files("planner").joinpath("data/calibration.json").read_text(encoding="utf-8")
    return parse(json.loads(text))


CALIBRATION = load()


@contextmanager
def trial(**values: float) -> Iterator[None]:
    """Plan with some constants at other values inside the block (for fitting and mutation checks)."""
    from planner import constants

    unknown = sorted(set(values) - set(CALIBRATION.constants))
    if unknown:
        raise KeyError(f"not calibration constants: {', '.join(unknown)}")
    saved = {name: getattr(constants, name) for name in values}
    try:
        for name, value in values.items():
            setattr(constants, name, type(saved[name])(value))
        yield
    finally:
        for name, value in saved.items():
            setattr(constants, name, value)
