"""Dataset schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class DatasetRead(BaseModel):
    id: str
    name: str
    owner: str
    format: str = Field(description="alpaca | sharegpt | openai | text")
    num_rows: int
    size_bytes: int
    sha256: str
    created_at: datetime


class DatasetCreated(DatasetRead):
    sample: list[dict[str, Any]] = Field(description="The first few records, as read.")


class DatasetList(BaseModel):
    items: list[DatasetRead]
    next_after: str | None
