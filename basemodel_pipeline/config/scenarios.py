"""Config models of scenarios and their targets."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from basemodel_pipeline.config.base import IDENTIFIER, Strict


class BinaryTarget(Strict):
    """Positive when an entity has any (event: any) or no (event: none) event of `source` in the window."""

    kind: Literal["binary"] = "binary"
    source: str
    event: Literal["any", "none"] = "any"
    horizon_days: int = Field(gt=0)
    active_in_last_days: int | None = Field(
        default=None,
        gt=0,
        description="Population: only entities with an event in this many days before the split.",
    )


class MultilabelTarget(Strict):
    """One label per value of `column`: did the entity have an event with that value in the window."""

    kind: Literal["multilabel"] = "multilabel"
    source: str
    column: str
    horizon_days: int = Field(gt=0)
    min_positive_entities: int = Field(
        default=50, gt=0, description="Keep values with at least this many positive entities in training."
    )


Target = Annotated[BinaryTarget | MultilabelTarget, Field(discriminator="kind")]


class Scenario(Strict):
    name: Annotated[str, Field(pattern=IDENTIFIER)]
    task: Literal["binary", "multilabel"]
    target: Target

    @model_validator(mode="after")
    def _task_matches_target(self) -> Scenario:
        if self.task != self.target.kind:
            raise ValueError(
                f"task '{self.task}' needs a target of kind '{self.task}', got '{self.target.kind}'"
            )
        return self
