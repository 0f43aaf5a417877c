"""``GET /v1/catalogue/models``: the planner's built-in models, for ``model.name`` in a spec."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import CurrentUser
from planner.catalogue import catalogue

router = APIRouter(prefix="/v1/catalogue", tags=["catalogue"])


class CatalogueModel(BaseModel):
    name: str = Field(description="The Hugging Face repository id; `model.name` in a spec.")
    num_parameters: int
    model_type: str | None
    max_position_embeddings: int | None
    source: str = Field(description="The config.json the architecture was copied from.")


class CatalogueModelList(BaseModel):
    items: list[CatalogueModel]


@router.get("/models", summary="Models the planner knows by name")
def catalogue_models(_user: CurrentUser) -> CatalogueModelList:
    return CatalogueModelList(
        items=[
            CatalogueModel(
                name=e.name,
                num_parameters=e.num_parameters,
                model_type=e.config.get("model_type"),
                max_position_embeddings=e.config.get("max_position_embeddings"),
                source=e.source,
            )
            for e in sorted(catalogue().values(), key=lambda e: e.name.lower())
        ]
    )
