"""The body of ``POST /v1/fine_tuning/jobs`` as the ``openai`` SDK sends it (its ``job_create_params``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Auto = Literal["auto"]
#: how an uploaded chat JSONL file ({"messages": [{"role", "content"}, ...]} per line) is read
FILE_FORMAT = "openai"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Hyperparameters(_Strict):
    batch_size: Annotated[int, Field(ge=1, le=4096)] | Auto | None = None
    learning_rate_multiplier: Annotated[float, Field(gt=0, le=1000)] | Auto | None = None
    n_epochs: Annotated[int, Field(ge=1, le=1000)] | Auto | None = None


class Supervised(_Strict):
    hyperparameters: Hyperparameters | None = None


class Method(_Strict):
    type: Literal["supervised"]
    supervised: Supervised | None = None


class FineTuningJobCreate(_Strict):
    model: Annotated[str, Field(min_length=1, max_length=4096)]
    training_file: Annotated[str, Field(min_length=1, max_length=64)]
    validation_file: Annotated[str, Field(max_length=64)] | None = None
    hyperparameters: Hyperparameters | None = None
    method: Method | None = None
    suffix: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = None
    integrations: list[dict[str, Any]] | None = None
    #: tunebox's own job spec fields (``extra_body={"tunebox": {...}}``), merged over what the OpenAI
    #: fields give: ``lora``, ``training``, ``resources``, ``eval``, ``method``, ``dataset``, ``priority``
    tunebox: dict[str, Any] | None = None

    def hyper(self) -> Hyperparameters:
        """The hyperparameters, from ``method.supervised`` or the older top-level field."""
        supervised = self.method.supervised if self.method is not None else None
        if supervised is not None and supervised.hyperparameters is not None:
            return supervised.hyperparameters
        return self.hyperparameters or Hyperparameters()
