"""Built-in catalogue of popular open models: their config.json architecture fields.

Each entry cites the Hugging Face repository its fields come from. Loaded on first use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from planner.errors import PlanError

__all__ = ["CatalogueEntry", "catalogue", "lookup"]


@dataclass(frozen=True, slots=True)
class CatalogueEntry:
    name: str  # the HF repository id
    source: str  # URL of the config.json the fields were copied from
    num_parameters: int  # as published for the checkpoint
    config: dict[str, Any]


@cache
def catalogue() -> dict[str, CatalogueEntry]:
    raw = json.loads(resources.files("planner").joinpath("data/catalogue.json").read_text(encoding="utf-8"))
    return {
        name: CatalogueEntry(name, e["source"], int(e["num_parameters"]), e["config"])
        for name, e in raw["models"].items()
    }


def lookup(name: str) -> CatalogueEntry:
    """Find by repository id, case-insensitively, with or without the organisation."""
    entries = catalogue()
    wanted = name.strip().lower()
    for key, entry in entries.items():
        if key.lower() == wanted or key.split("/", 1)[1].lower() == wanted:
            return entry
    close = sorted(k for k in entries if wanted.split("/")[-1][:6] in k.lower())
    hint = f"; did you mean {', '.join(close[:3])}?" if close else ""
    raise PlanError(
        "model.name",
        f"{name!r} is not in the built-in catalogue{hint} (give model.config or model.path instead)",
    )
