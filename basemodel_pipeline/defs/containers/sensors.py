"""Run-status sensors of container deployments: remove a run's containers when it succeeds, fails or is
cancelled (included with the docker launcher backend, or BASEMODEL_RUN_LAUNCHER=docker).

The launcher removes each step's trainer container itself; these sensors remove the exited run worker
(DockerRunLauncher leaves it) and whatever a killed run worker or a cancellation left behind (containers are
found by their `dagster/run_id` label). They run whether automation is running or stopped.
"""

import dagster as dg

from basemodel_pipeline.defs.shared.containers import remove_run_containers

FINAL_STATUSES = {
    "success": dg.DagsterRunStatus.SUCCESS,
    "failure": dg.DagsterRunStatus.FAILURE,
    "canceled": dg.DagsterRunStatus.CANCELED,
}


def build_cleanup_sensors() -> list[dg.SensorDefinition]:
    def make(name: str, status: dg.DagsterRunStatus) -> dg.SensorDefinition:
        @dg.run_status_sensor(
            name=f"remove_containers_on_{name}",
            run_status=status,
            default_status=dg.DefaultSensorStatus.RUNNING,
            minimum_interval_seconds=30,
        )
        def _remove(context: dg.RunStatusSensorContext) -> None:
            removed = remove_run_containers(context.dagster_run.run_id)
            if removed:
                context.log.info(f"removed {len(removed)} containers of run {context.dagster_run.run_id}")

        return _remove

    return [make(name, status) for name, status in FINAL_STATUSES.items()]
