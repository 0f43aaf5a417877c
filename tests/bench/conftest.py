"""Bench tests run DeepSpeed on the CPU: pick its CPU accelerator before anything imports it."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
