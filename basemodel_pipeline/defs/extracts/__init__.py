"""Extracts: one asset per data source (events: daily partitions), their schema and volume checks, the
new-data sensor, and the refresh jobs with the nightly schedule that extracts the new days."""

from __future__ import annotations

import dagster as dg

from basemodel_pipeline.defs.extracts.assets import build_extract_assets, days_partitions, extract_key
from basemodel_pipeline.defs.extracts.checks import build_extract_checks
from basemodel_pipeline.defs.extracts.schedules import build_jobs, build_nightly_schedule
from basemodel_pipeline.defs.extracts.sensors import build_new_data_sensor
from basemodel_pipeline.defs.shared.deployment import Deployment


def defs(deployment: Deployment) -> dg.Definitions:
    sources = list(deployment.shape.data_sources)
    keys = [extract_key(s.name) for s in sources]
    return dg.Definitions(
        assets=build_extract_assets(
            sources,
            days_partitions(
                deployment.shape.data_params.data_start_date, deployment.shape.data_params.data_end_date
            ),
        ),
        asset_checks=[c for s in sources for c in build_extract_checks(s, extract_key(s.name))],
        jobs=build_jobs(keys),
        schedules=[build_nightly_schedule(deployment.schedule_status)],
        sensors=[
            build_new_data_sensor(
                [extract_key(s.name) for s in sources if s.type == "event"], deployment.sensor_status
            )
        ],
    )
