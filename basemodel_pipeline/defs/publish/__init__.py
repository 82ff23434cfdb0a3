"""Publishing: published_artifacts copies finished artifacts to s3:// (only when BASEMODEL_PUBLISH_URL is set)."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.publish.assets import published_artifacts
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    return dg.Definitions(assets=[published_artifacts] if deployment.publishing else [])
