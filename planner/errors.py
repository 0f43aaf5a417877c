"""The one error the planner raises for bad input."""

from __future__ import annotations

__all__ = ["PlanError"]


class PlanError(ValueError):
    """A spec the planner cannot plan, naming the dotted spec location at fault.

    ``field`` is where the user should look (``"model.config.num_attention_heads"``,
    ``"resources.deepspeed.reduce_bucket_sise"``); the API turns it into a 422 problem body.
    ``code`` says what kind of refusal it is (``"invalid_spec"`` for a value the planner cannot
    read; the others, such as ``"num_gpus_exceeds_box"``, for a spec the box cannot run).
    """

    def __init__(self, field: str, message: str, code: str = "invalid_spec") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code
