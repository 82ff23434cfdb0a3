"""Config model of the `retention` section: how many versions of each workspace artifact to keep.

    retention:
      keep_checkpoints: 3    # per checkpoint root (the foundation, each scenario); null = keep every version
      keep_predictions: 30   # as-of dates per scenario
      keep_embeddings: 3     # as-of dates

Whatever is still in use is kept beyond these counts (basemodel_pipeline/ops/retention.py).
"""

from __future__ import annotations

from pydantic import Field

from basemodel_pipeline.config.base import Strict

DEFAULT_KEEP_CHECKPOINTS = 3
DEFAULT_KEEP_PREDICTIONS = 30
DEFAULT_KEEP_EMBEDDINGS = 3


class RetentionParams(Strict):
    keep_checkpoints: int | None = Field(
        default=DEFAULT_KEEP_CHECKPOINTS,
        ge=1,
        description="Newest versions kept per checkpoint root (foundation, each scenario); null keeps all.",
    )
    keep_predictions: int | None = Field(
        default=DEFAULT_KEEP_PREDICTIONS,
        ge=1,
        description="Newest as-of dates of predictions kept per scenario; null keeps all.",
    )
    keep_embeddings: int | None = Field(
        default=DEFAULT_KEEP_EMBEDDINGS,
        ge=1,
        description="Newest as-of dates of entity embeddings kept; null keeps all.",
    )
