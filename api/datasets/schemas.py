"""Dataset schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class DatasetRead(BaseModel):
    id: str
    name: str
    owner: str
    format: str = Field(description="alpaca | sharegpt | openai | text")
    num_rows: int
    size_bytes: int
    sha256: str
    shared: bool = Field(description="Shared by its owner: every user may list, read and train on it.")
    created_at: datetime


class DatasetCreated(DatasetRead):
    sample: list[dict[str, Any]] = Field(description="The first few records, as read.")


class DatasetList(BaseModel):
    items: list[DatasetRead]
    next_after: str | None


class DatasetUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shared: bool | None = Field(default=None, description="Share with every user (true) or keep it yours.")
    name: str | None = Field(default=None, min_length=1, max_length=200)
