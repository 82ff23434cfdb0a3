"""The scenario's CPU phase (baselines fitted and staged by `run_baselines`) and its reuse by fine-tuning.

Real cache, foundation and LightGBM on the tiny dataset: fine-tuning with a stage gives exactly the result of
fine-tuning alone, reads the staged outputs instead of fitting again, and ignores a stage of another cache or
of an edited scenario; every LightGBM fit logs its progress.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from basemodel_pipeline.config import Scenario, load_config
from basemodel_pipeline.evaluation.gbm import fit_gbm
from basemodel_pipeline.pipeline import run_baselines, run_cache, run_extract, run_finetune, run_pretrain
from basemodel_pipeline.progress import LogProgress
from basemodel_pipeline_tests.test_gbm_sampling import trees

SCENARIO = "department_propensity"  # multilabel: one LightGBM per class


@pytest.fixture(scope="module")
def trained(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("stage")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    cfg = load_config(shutil.copy(tiny_dataset, d / "config.yaml"))
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    return cfg


def _metrics(meta: dict) -> dict:
    return json.loads((Path(meta["path"]) / "metrics.json").read_text())


def _same_model(a: dict, b: dict) -> None:
    """The same published candidate, validation and test metrics of every candidate, and selection."""
    for key in ("published", "test", "test_metrics", "best_val", "examples", "classes"):
        assert a[key] == b[key], key
    assert a["selection"]["validation"] == b["selection"]["validation"]
    assert a["selection"]["blend"] == b["selection"]["blend"]


def test_finetune_reuses_the_staged_baselines_with_identical_results(trained) -> None:
    cfg = trained
    alone = run_finetune(cfg, SCENARIO)  # no stage: everything inline, as `basemodel finetune` does
    assert alone["baselines_reused"] is False

    lines: list[str] = []
    staged = run_baselines(cfg, SCENARIO, LogProgress(lines.append))
    stage = Path(staged["path"])
    assert stage.is_dir() and stage.parent.parent.name == "baselines" and staged["reused"] is False
    assert set(staged["candidates"]) == {"lightgbm_aggregates", "popularity"}
    assert not list(stage.parent.glob(".*.tmp"))  # written atomically
    # progress of the one-vs-rest LightGBM: a line per class with the elapsed time
    classes = alone["classes"]
    fitted = [x for x in lines if "lightgbm_aggregates" in x and "class" in x and " s" in x]
    assert any(f"class {classes}/{classes}" in x for x in fitted), lines

    reused = run_finetune(cfg, SCENARIO)
    assert reused["baselines_reused"] is True
    _same_model(_metrics(alone), _metrics(reused))
    assert _metrics(reused)["baselines"]["reused"] is True

    again = run_baselines(cfg, SCENARIO)  # the same inputs: the stage is kept, nothing is fitted again
    assert again["reused"] is True and again["path"] == staged["path"]
    assert again["data_version"] == staged["data_version"]

    # the staged outputs are what fine-tuning reports: doctor the staged test outputs of LightGBM
    pop = np.load(stage / "test" / "popularity.npy")
    np.save(stage / "test" / "lightgbm_aggregates.npy", pop)
    doctored = _metrics(run_finetune(cfg, SCENARIO))
    assert doctored["test"]["lightgbm_aggregates"] == doctored["test"]["popularity"]
    shutil.rmtree(stage)


def test_a_stage_of_an_edited_scenario_is_not_reused(trained) -> None:
    cfg = trained
    run_baselines(cfg, "churn")
    sc = cfg.scenario("churn")
    edited = sc.model_copy(update={"lightgbm_top_labels": sc.lightgbm_top_labels + 1})
    cfg2 = cfg.model_copy(update={"scenarios": [edited if s.name == "churn" else s for s in cfg.scenarios]})
    assert run_finetune(cfg2, "churn")["baselines_reused"] is False
    assert run_finetune(cfg, "churn")["baselines_reused"] is True


def test_a_stage_of_another_cache_is_not_reused(tiny_config: Path) -> None:
    import pyarrow.parquet as pq

    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    first = run_baselines(cfg, "churn")
    # a changed source (one event dropped): a new cache data_version, the same foundation
    path = tiny_config.parent / "data" / "transactions.parquet"
    table = pq.read_table(path)
    pq.write_table(table.slice(1), path)
    run_extract(cfg)
    assert run_cache(cfg)["data_version"] != first["cache_data_version"]
    assert run_finetune(cfg, "churn")["baselines_reused"] is False
    second = run_baselines(cfg, "churn")
    assert second["data_version"] != first["data_version"] and second["reused"] is False


def test_class_parallel_lightgbm_fits_the_same_models() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 6))
    Y = (X[:, :5] + rng.normal(size=(600, 5)) > 0.5).astype(np.float64)
    Y[:, 4] = 0  # a constant column
    lines: list[str] = []
    serial = fit_gbm("binary", X[:400], Y[:400], X[400:], Y[400:], seed=3, workers=1)
    parallel = fit_gbm(
        "binary",
        X[:400],
        Y[:400],
        X[400:],
        Y[400:],
        seed=3,
        workers=2,
        progress=LogProgress(lines.append),
    )
    # the same trees (the parameters section records the LightGBM threads, 2 serial and 1 side by side)
    assert trees(parallel) == trees(serial) and parallel.rounds == serial.rounds
    fitted = [x for x in lines if "fitted (" in x]  # one line per booster (the constant column has none)
    assert len(fitted) == 4 and any("class 5/5" in x and "s elapsed" in x for x in fitted), lines


def test_the_multilabel_lightgbm_row_bound_is_recorded_in_the_metrics(trained) -> None:
    """Each per-label booster trains on at most `lightgbm_max_rows` rows; metrics.json says how many it had."""
    cfg = trained
    sc = cfg.scenario(SCENARIO)
    bounded = sc.model_copy(update={"lightgbm_max_rows": 60})
    cfg2 = cfg.model_copy(update={"scenarios": [bounded if s.name == SCENARIO else s for s in cfg.scenarios]})
    meta = run_finetune(cfg2, SCENARIO)
    m = _metrics(meta)
    rows = m["lightgbm_rows"]["lightgbm_aggregates"]
    assert rows["max_rows"] == 60 and rows["rows"] == m["examples"]["train"] > 60
    assert rows["boosters"] >= 1 and all(r <= 60 for r in rows["rows_per_booster"])
    assert max(rows["rows_per_booster"]) == 60
    report = (Path(meta["path"]) / "report.html").read_text()
    assert f"boosters trained on a sample of at most 60 of the {rows['rows']:,} rows" in report


def test_the_multilabel_lightgbm_samples_rows_by_default() -> None:
    """A multilabel baseline's boosters are bounded by default, not only when asked."""
    from basemodel_pipeline.config.scenarios import LIGHTGBM_MAX_ROWS

    sc = Scenario.model_validate(
        {
            "name": "m",
            "task": "multilabel",
            "target": {"kind": "multilabel", "source": "s", "column": "c", "horizon_days": 7},
        }
    )
    assert sc.lightgbm_max_rows == LIGHTGBM_MAX_ROWS == 10_000
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(12_500, 4)), (rng.random((12_500, 2)) < 0.3).astype(float)
    Y[:, 0] = (X[:, 0] + rng.normal(0, 0.5, 12_500) > 0.5).astype(float)
    gbm = fit_gbm("binary", X[:12_000], Y[:12_000], X[12_000:], Y[12_000:], max_rows=sc.lightgbm_max_rows)
    assert gbm.train_rows == [10_000, 10_000] and gbm.available_rows == 12_000
