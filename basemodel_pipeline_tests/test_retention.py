"""Retention: prune keeps the newest versions and everything still in use, deletes the rest safely.

Workspaces are written through the library's own writers (publish_checkpoint, open_writer, provenance), and
one test runs the tiny pipeline for real: the pruned workspace still trains, scores and embeds.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from typer.testing import CliRunner

from basemodel_pipeline import files as fs
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cli import app
from basemodel_pipeline.config import PipelineConfig, load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.model.checkpoint import (
    CheckpointMeta,
    build_model,
    load_checkpoint,
    publish_checkpoint,
)
from basemodel_pipeline.ops.retention import plan_retention, prune
from basemodel_pipeline.outputs import open_writer

ARCH = {"in_dim": 4, "hidden_dim": 8, "num_blocks": 1, "dropout": 0.0, "out_dim": 1}
runner = CliRunner()


def with_retention(config: Path, **keep: Any) -> PipelineConfig:
    raw = yaml.safe_load(config.read_text())
    raw["retention"] = keep
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_config(config)


def foundation(cfg: PipelineConfig, latest: bool = True) -> str:
    root = ws.foundation_root(cfg)
    pointer = (root / "LATEST").read_text() if (root / "LATEST").exists() else None
    version, _ = publish_checkpoint(
        root, build_model(ARCH), CheckpointMeta(kind="foundation", arch=ARCH), promote=True
    )
    if not latest and pointer is not None:  # published but LATEST not moved yet: a run in progress
        fs.set_latest(root, pointer.strip())
    return version


def scenario(cfg: PipelineConfig, name: str, foundation_version: str) -> str:
    meta = CheckpointMeta(kind="scenario", arch=ARCH, foundation_version=foundation_version)
    version, _ = publish_checkpoint(ws.scenario_root(cfg, name), build_model(ARCH), meta, promote=True)
    return version


def output(cfg: PipelineConfig, dataset: str, name: str | None, day: dt.date, **versions: str) -> Path:
    writer = open_writer(cfg, dataset, name, day)
    if versions:
        ws.write_provenance(writer.directory, scenario=name, **versions)
    writer.write(pa.table({"entity_id": ["a", "b"], "score": [0.1, 0.2]}))
    return Path(writer.close()["path"]).parent


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def names(parent: Path) -> set[str]:
    """The version (or as-of) directories under `parent`: not a checkpoint root's verdicts/."""
    return {p.name for p in parent.iterdir() if p.is_dir() and p.name != fs.VERDICTS}


@pytest.fixture
def workspace(tiny_config: Path) -> dict[str, Any]:
    """Foundations F1..F6 (LATEST F5, F6 being published), scenario churn S1..S4 fine-tuned from older
    foundations (the LATEST S4 from the oldest, F1), 40 days of churn predictions made from S1..S4, scenario
    dept D1..D3 with a prediction that predates provenance files, and three days of embeddings."""
    cfg = with_retention(tiny_config, keep_checkpoints=2, keep_predictions=3, keep_embeddings=1)
    F = [foundation(cfg) for _ in range(5)]
    F.append(foundation(cfg, latest=False))
    S = [scenario(cfg, "churn", f) for f in (F[1], F[2], F[3], F[0])]
    day0 = dt.date(2024, 1, 1)
    days = [day0 + dt.timedelta(days=i) for i in range(40)]
    made_from = [S[0]] * 37 + [S[1], S[2], S[3]]  # the last three days: S2, S3, S4
    for day, s in zip(days, made_from, strict=True):
        output(cfg, "predictions", "churn", day, model_version=s)
    D = [scenario(cfg, "dept", F[4])]
    legacy = output(cfg, "predictions", "dept", day0)  # written before provenance existed, from D1
    D += [scenario(cfg, "dept", F[4]) for _ in range(2)]
    between = ws_time(D[0]) + (ws_time(D[1]) - ws_time(D[0])) / 2
    for f in legacy.iterdir():
        os.utime(f, (between.timestamp(), between.timestamp()))
    output(cfg, "predictions", "dept", day0 + dt.timedelta(days=1), model_version=D[2])
    for i in range(3):
        output(cfg, "embeddings", None, day0 + dt.timedelta(days=i), foundation_version=F[4])
    return {"cfg": cfg, "F": F, "S": S, "D": D, "days": days}


def ws_time(version: str) -> dt.datetime:
    return dt.datetime.strptime(version, "%Y%m%dT%H%M%S%fZ").replace(tzinfo=dt.UTC)


def test_prune_keeps_the_newest_and_everything_in_use(workspace: dict[str, Any]) -> None:
    cfg, F, S, D, days = (workspace[k] for k in ("cfg", "F", "S", "D", "days"))
    root = Path(cfg.workspace)
    plan = prune(cfg)

    # F1 stays: the LATEST churn checkpoint was fine-tuned from it; F3, F4: kept S2 and S3; F5 LATEST;
    # F6 newer than LATEST (being published). F2 was only used by S1, which goes.
    assert names(ws.foundation_root(cfg)) == {F[0], F[2], F[3], F[4], F[5]}
    # S3, S4 newest two; S2 kept because kept predictions (2024-02-07) were made from it
    assert names(ws.scenario_root(cfg, "churn")) == {S[1], S[2], S[3]}
    # D1 kept: the legacy prediction (no provenance.json) was written after D1 and before D2
    assert names(ws.scenario_root(cfg, "dept")) == set(D)
    assert names(root / "predictions" / "churn") == {d.isoformat() for d in days[-3:]}
    assert names(root / "predictions" / "dept") == {"2024-01-01", "2024-01-02"}
    assert names(root / "embeddings") == {"2024-01-03"}

    deleted = {e.label for e in plan.delete}
    assert deleted == {
        f"foundation {F[1]}",
        f"scenario churn/{S[0]}",
        *(f"predictions churn/{d.isoformat()}" for d in days[:-3]),
        "embeddings 2024-01-01",
        "embeddings 2024-01-02",
    }
    reasons = {e.label: e.reason for e in plan.keep}
    assert reasons[f"foundation {F[0]}"] == f"used by scenario churn/{S[3]}"
    assert reasons[f"foundation {F[5]}"].startswith("newer than LATEST")
    assert reasons[f"scenario churn/{S[1]}"] == "used by predictions churn/2024-02-07"
    assert plan.bytes_freed > 0 and plan.summary()["deleted_predictions"] == 37

    # what is left still loads, and nothing half-deleted or hidden stays behind
    for version in names(ws.foundation_root(cfg)):
        load_checkpoint(ws.foundation_root(cfg) / version)
    for version in names(ws.scenario_root(cfg, "churn")):
        _, meta = load_checkpoint(ws.scenario_root(cfg, "churn") / version)
        assert meta.foundation_version in names(ws.foundation_root(cfg))
    assert ws.latest_foundation_dir(cfg).name == F[4] and ws.latest_scenario_dir(cfg, "churn").name == S[3]
    assert not [p for p in root.rglob(".*") if p.is_dir()]

    assert not prune(cfg).delete  # a second prune has nothing left to do


def test_dry_run_deletes_nothing_and_reports_the_same_plan(workspace: dict[str, Any]) -> None:
    cfg = workspace["cfg"]
    root = Path(cfg.workspace)
    before = listing(root)
    plan = prune(cfg, dry_run=True)
    assert listing(root) == before
    assert len(plan.delete) == 41 and plan.bytes_freed == sum(e.bytes for e in plan.delete) > 0
    assert [e.label for e in plan_retention(cfg).delete] == [e.label for e in plan.delete]


def test_cli_prune_dry_run_then_prune(workspace: dict[str, Any], tiny_config: Path) -> None:
    cfg, F = workspace["cfg"], workspace["F"]
    before = listing(Path(cfg.workspace))
    result = runner.invoke(app, ["prune", "--config", str(tiny_config), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "dry run: would delete 41 directories" in " ".join(result.output.split())
    assert F[1] in result.output and listing(Path(cfg.workspace)) == before
    result = runner.invoke(app, ["prune", "--config", str(tiny_config)])
    assert result.exit_code == 0, result.output
    assert "deleted 41 directories" in " ".join(result.output.split())
    assert F[1] not in names(ws.foundation_root(cfg))


def test_keep_everything_and_roots_without_latest_are_left_alone(tiny_config: Path) -> None:
    cfg = with_retention(tiny_config, keep_checkpoints=None, keep_predictions=None, keep_embeddings=None)
    versions = [foundation(cfg) for _ in range(3)]
    for day in range(5):
        output(cfg, "predictions", "churn", dt.date(2024, 1, 1 + day), model_version="x")
    assert not prune(cfg).delete

    cfg = with_retention(tiny_config, keep_checkpoints=1)
    (ws.foundation_root(cfg) / "LATEST").unlink()  # e.g. a copied workspace: nothing says what is in use
    (ws.foundation_root(cfg) / "manual-backup").mkdir()  # not a version name: never touched
    leftover = ws.foundation_root(cfg) / f".{versions[0]}.pruned.tmp"  # an interrupted prune
    leftover.mkdir()
    plan = prune(cfg)
    assert not [e for e in plan.delete if e.kind == "foundation"]
    assert names(ws.foundation_root(cfg)) == {*versions, "manual-backup"} and not leftover.exists()


def test_policy_defaults_and_user_errors(tiny_config: Path) -> None:
    policy = load_config(tiny_config).retention
    assert (policy.keep_checkpoints, policy.keep_predictions, policy.keep_embeddings) == (3, 30, 3)
    with pytest.raises(UserError, match="retention.keep_checkpoints"):
        with_retention(tiny_config, keep_checkpoints=0)
    result = runner.invoke(app, ["prune", "--config", str(tiny_config.parent / "nope.yaml")])
    assert result.exit_code == 2 and result.stderr.startswith("error: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_real_pipeline_outputs_record_provenance_and_survive_pruning(tiny_config: Path) -> None:
    """Train, score and embed for real; a newer foundation; prune keeping one checkpoint: the scenario's
    foundation stays, and scoring and embedding still work on the pruned workspace."""
    from basemodel_pipeline import pipeline

    cfg = with_retention(tiny_config, keep_checkpoints=1)
    pipeline.run_extract(cfg)
    pipeline.run_cache(cfg)
    first = pipeline.run_pretrain(cfg)["version"]
    tuned = pipeline.run_finetune(cfg, "churn")["version"]
    scored = Path(pipeline.run_predict(cfg, "churn", None)["path"]).parent
    embedded = Path(pipeline.run_embed(cfg, None)["path"])
    cache_versions = {"cache_data_version", "cache_history"}  # the cache content scored (verify: stale)
    record = ws.read_provenance(scored) or {}
    assert {k: v for k, v in record.items() if k not in cache_versions} == {
        "scenario": "churn",
        "model_version": tuned,
        "foundation_version": first,
        "checksums": "manifest.json",  # the output says it has a manifest (verify: a missing one fails)
    }
    assert cache_versions <= set(record)
    record = ws.read_provenance(embedded) or {}
    assert {k: v for k, v in record.items() if k not in cache_versions} == {
        "foundation_version": first,
        "checksums": "manifest.json",
    }
    second = pipeline.run_pretrain(cfg)["version"]

    plan = prune(cfg)
    assert names(ws.foundation_root(cfg)) == {first, second}  # first: used by churn's LATEST (and outputs)
    assert not plan.delete
    third = pipeline.run_pretrain(cfg)["version"]
    plan = prune(cfg)
    assert [e.label for e in plan.delete] == [f"foundation {second}"]
    assert names(ws.foundation_root(cfg)) == {first, third}
    assert pipeline.run_predict(cfg, "churn", None)["model_version"] == tuned
    assert pipeline.run_embed(cfg, None)["foundation_version"] == third


def test_dagster_retention_asset_and_daily_schedule_in_a_real_instance(
    workspace: dict[str, Any], tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from basemodel_pipeline.defs import build_definitions
    from basemodel_pipeline.defs.shared.resources import BasemodelConfigResource

    cfg, F = workspace["cfg"], workspace["F"]
    monkeypatch.setenv("BASEMODEL_AUTOMATION", "stopped")
    defs = build_definitions(str(tiny_config), env="ci")
    schedule = defs.resolve_schedule_def("workspace_retention_daily")
    job = defs.resolve_job_def("prune_workspace")
    before = listing(Path(cfg.workspace))
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=dt.datetime(2024, 3, 2, 5, tzinfo=dt.UTC),
            resources={"basemodel_config": BasemodelConfigResource(config_path=str(tiny_config))},
        )
        (request,) = schedule.evaluate_tick(context).run_requests
        assert request.run_key == "retention-2024-03-02"

        dry = job.execute_in_process(
            instance=instance, run_config={"ops": {"workspace_retention": {"config": {"dry_run": True}}}}
        )
        (mat,) = dry.asset_materializations_for_node("workspace_retention")
        assert mat.metadata["dry_run"].value is True and mat.metadata["deleted_predictions"].value == 37
        assert listing(Path(cfg.workspace)) == before

        result = job.execute_in_process(instance=instance, tags=request.tags)
        (mat,) = result.asset_materializations_for_node("workspace_retention")
        meta = {k: v.value for k, v in mat.metadata.items()}
        assert meta["dry_run"] is False and meta["bytes_freed"] > 0
        assert (meta["deleted_foundation"], meta["kept_foundation"]) == (1, 5)
        assert (meta["deleted_scenario"], meta["deleted_embeddings"]) == (1, 2)
        assert f"foundation {F[1]}" in meta["deleted"]
        assert F[1] not in names(ws.foundation_root(cfg)) and F[0] in names(ws.foundation_root(cfg))
        records = instance.fetch_materializations(dg.AssetKey("workspace_retention"), limit=5).records
        assert len(records) == 2


def test_prune_through_symlinked_directories_removes_only_what_the_pipeline_wrote(
    tiny_config: Path, tmp_path: Path
) -> None:
    """predictions/<scenario> and checkpoints/scenarios/<name> are symlinks to another volume that also holds
    the user's own directories with the pipeline's names (dates, version names, no manifest): prune follows
    the links, removes the pipeline's old versions and never a directory it did not write."""
    cfg = with_retention(tiny_config, keep_checkpoints=1, keep_predictions=1, keep_embeddings=1)
    root = Path(cfg.workspace)
    elsewhere = tmp_path / "other_volume"
    for link, target in (
        (root / "predictions" / "churn", elsewhere / "predictions"),
        (ws.scenario_root(cfg, "churn"), elsewhere / "checkpoints"),
    ):
        target.mkdir(parents=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    foreign = [
        elsewhere / "predictions" / "2023-06-01",
        elsewhere / "checkpoints" / "20230601T000000000000Z",
    ]
    for d in foreign:
        d.mkdir()
        (d / "notes.txt").write_text("the user's own")
    f = foundation(cfg)
    S = [scenario(cfg, "churn", f) for _ in range(2)]
    for i in range(2):
        output(cfg, "predictions", "churn", dt.date(2024, 1, 1 + i), model_version=S[1])

    deleted = {e.label for e in prune(cfg).delete}

    assert deleted == {f"scenario churn/{S[0]}", "predictions churn/2024-01-01"}
    assert all((d / "notes.txt").read_text() == "the user's own" for d in foreign)
    assert names(elsewhere / "predictions") == {"2023-06-01", "2024-01-02"}
    assert ws.latest_scenario_dir(cfg, "churn").name == S[1]
