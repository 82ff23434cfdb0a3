"""Uploading: uploaded_artifacts copies finished artifacts to s3:// (only when BASEMODEL_UPLOAD_URL is set)."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.shared.deployment import Deployment
from basemodel_pipeline.defs.upload.assets import uploaded_artifacts


def defs(deployment: Deployment) -> dg.Definitions:
    return dg.Definitions(assets=[uploaded_artifacts] if deployment.uploading else [])
