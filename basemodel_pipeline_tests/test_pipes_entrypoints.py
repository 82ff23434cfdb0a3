"""The Pipes entrypoints (basemodel_pipeline.entrypoints) run through a real PipesSubprocessClient."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from basemodel_pipeline.defs.shared.execution import run_entrypoint
from basemodel_pipeline.defs.shared.launcher import Launcher
from basemodel_pipeline.metadata import flatten_metadata, to_pipes_metadata


def _materialize(asset: dg.AssetsDefinition, config: Path, **kwargs: object) -> dg.ExecuteInProcessResult:
    with dg.instance_for_test() as instance:
        if asset.partitions_def is not None:
            instance.add_dynamic_partitions("scenarios", [str(kwargs["partition_key"])])
        return dg.materialize(
            [asset],
            instance=instance,
            resources={"launcher": Launcher(backend="subprocess")},
            raise_on_error=False,
            **kwargs,
        )


def _extract_asset(config: Path) -> dg.AssetsDefinition:
    @dg.asset(name="transactions_extract")
    def transactions_extract(context: dg.AssetExecutionContext, launcher: Launcher) -> dg.MaterializeResult:
        return run_entrypoint(context, launcher, "extract", str(config), ["--source", "transactions"])

    return transactions_extract


def test_extract_job_reports_metadata_through_pipes(tiny_config: Path) -> None:
    result = _materialize(_extract_asset(tiny_config), tiny_config)
    assert result.success
    (mat,) = result.asset_materializations_for_node("transactions_extract")
    assert mat.metadata["rows"].value > 0
    assert isinstance(mat.metadata["path"], dg.PathMetadataValue)
    assert Path(mat.metadata["path"].value) == tiny_config.parent / "extracts" / "transactions"
    assert mat.tags and mat.tags.get("dagster/data_version")


def test_user_error_in_job_fails_the_run_with_its_message(tiny_config: Path) -> None:
    partitions = dg.DynamicPartitionsDefinition(name="scenarios")

    @dg.asset(partitions_def=partitions)
    def scenario(context: dg.AssetExecutionContext, launcher: Launcher):
        return run_entrypoint(context, launcher, "finetune", str(tiny_config))

    result = _materialize(scenario, tiny_config, partition_key="no_such_scenario")
    assert not result.success
    (failure,) = result.get_step_failure_events()
    description = failure.step_failure_data.user_failure_data.description
    assert "unknown scenario 'no_such_scenario'" in description and "churn" in description


def test_entrypoint_runs_outside_dagster(tiny_config: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    cmd = [
        sys.executable,
        "-m",
        "basemodel_pipeline.entrypoints.extract",
        "--config",
        str(tiny_config),
        "--source",
        "products",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert report["metadata"]["rows"] > 0 and report["data_version"]


def test_entrypoint_user_error_exit_code_and_one_line(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "basemodel_pipeline.entrypoints.pretrain",
        "--config",
        str(tmp_path / "missing.yaml"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: pretrain:") and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_metadata_flattening_drops_secrets_and_types_paths() -> None:
    meta = {
        "rows": 3,
        "path": "/w/x",
        "password": "hunter2",
        "source": {"rows": 2, "cache_dir": "/w/c", "api_key": "k"},
        "history": [0.5, 0.25],
        "loss": float("nan"),
        "missing": None,
    }
    flat = flatten_metadata(meta)
    assert flat["rows"] == ("infer", 3)
    assert flat["path"] == ("path", "/w/x") and flat["source.cache_dir"] == ("path", "/w/c")
    assert flat["history"] == ("json", [0.5, 0.25])
    assert not any("password" in k or "api_key" in k for k in flat)
    pipes = to_pipes_metadata(meta)
    assert pipes["loss"] == {"raw_value": "nan", "type": "text"}
    assert pipes["source.rows"] == 2


def test_user_error_reaches_dagster_without_a_shared_filesystem(tiny_config: Path, monkeypatch) -> None:
    """Kubernetes and ECS steps share no file with the orchestrator: the one-line user error must come back
    through the Pipes messages alone. A k8s launcher whose pod is stood in for by a local process (the same
    Pipes protocol: context in, messages out, nothing else shared) fails with the user's line."""

    def launch_as_pod(self: Launcher, context, stage, command, extras):  # noqa: ANN001
        assert not extras, "k8s steps cannot read a file the orchestrator wrote"
        local = [sys.executable, *command[1:]]  # the pod's `python` is this interpreter here
        return dg.PipesSubprocessClient().run(context=context, command=local, extras=extras)

    monkeypatch.setattr(Launcher, "_launch", launch_as_pod)
    partitions = dg.DynamicPartitionsDefinition(name="scenarios")

    @dg.asset(partitions_def=partitions)
    def scenario(context: dg.AssetExecutionContext, launcher: Launcher):
        return run_entrypoint(context, launcher, "finetune", str(tiny_config))

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["no_such_scenario"])
        result = dg.materialize(
            [scenario],
            instance=instance,
            resources={"launcher": Launcher(backend="k8s")},
            partition_key="no_such_scenario",
            raise_on_error=False,
        )
    assert not result.success
    (failure,) = result.get_step_failure_events()
    description = failure.step_failure_data.user_failure_data.description
    assert description.startswith("finetune: unknown scenario 'no_such_scenario'")
    assert "churn" in description and "\n" not in description.strip() and "Traceback" not in description
