"""finetune.refit_on_validation: the published candidate learns from the validation windows too, and what is
saved is what was measured on the test window."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from basemodel_pipeline.config import load_config
from basemodel_pipeline.evaluation.metrics import auroc
from basemodel_pipeline.pipeline import run_cache, run_extract, run_pretrain
from basemodel_pipeline.progress import NullProgress
from basemodel_pipeline.scenarios.finetune import finetune_many

GROCERY = {
    "kind": "binary",
    "source": "transactions",
    "horizon_days": 14,
    "filter": [{"column": "department", "op": "==", "value": "GROCERY"}],
}
PUBLISH = ("neural", "lightgbm_aggregates", "blend", "lightgbm_hybrid_seeds")


@pytest.fixture(scope="module")
def refit_world(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("refit")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    raw = yaml.safe_load(tiny_dataset.read_text())
    raw["training_params"]["finetune"]["refit_on_validation"] = True
    raw["training_params"]["finetune"]["refit_on_all"] = False  # the published model is the measured one
    raw["scenarios"] = [
        {"name": f"grocery_{p}", "task": "binary", "target": GROCERY, "publish": p} for p in PUBLISH
    ]
    (d / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(d / "config.yaml")
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    return cfg, finetune_many(cfg, cfg.scenarios, NullProgress())


@pytest.mark.parametrize("publish", PUBLISH)
def test_refit_on_validation_publishes_the_refit_model(refit_world, publish: str) -> None:
    from test_scenarios_tasks import _test_examples, replayed_test_scores

    cfg, results = refit_world
    name = f"grocery_{publish}"
    m = json.loads((Path(results[name]["path"]) / "metrics.json").read_text())
    assert m["refit"]["refit_on_validation"] and m["published"] == publish
    assert "refit_s" in m["timing_s"]
    assert m["test"]["model"] != m["test"][publish]  # before the refit, the same candidate scored otherwise
    cache, test = _test_examples(cfg, name)
    got = auroc(test.labels, replayed_test_scores(cfg, name, cache, test))
    assert got == pytest.approx(m["test"]["model"], abs=1e-9)  # the saved model is the refit one


def test_refit_on_all_learns_the_test_window_after_measuring_it(tiny_dataset: Path, tmp_path: Path) -> None:
    """refit_on_all: the test metric is measured before the refit (identical to a run without it), and the
    published model is then trained on every labelled window, the test window included."""
    from safetensors.numpy import load_file

    shutil.copytree(tiny_dataset.parent / "data", tmp_path / "data")
    raw = yaml.safe_load(tiny_dataset.read_text())
    raw["scenarios"] = [{"name": "grocery", "task": "binary", "target": GROCERY, "publish": "neural"}]
    raw["training_params"]["finetune"]["refit_on_all"] = False
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(config)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    plain = finetune_many(cfg, cfg.scenarios, NullProgress())["grocery"]
    windows = json.loads((Path(plain["path"]) / "metrics.json").read_text())["fit_windows"]
    assert windows["published"] == windows["evaluated"]  # switched off: published as evaluated
    # the library publishes no report of its own: pipeline.py composes it (reports.scenario.report_files)
    assert plain["report_path"] is None and not (Path(plain["path"]) / "report.html").exists()
    del raw["training_params"]["finetune"]["refit_on_all"]  # the default
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(config)
    refit = finetune_many(cfg, cfg.scenarios, NullProgress())["grocery"]

    m = json.loads((Path(refit["path"]) / "metrics.json").read_text())
    assert m["refit"]["refit_on_all"] and m["refit"]["windows"] == "training + validation + test"
    assert "refit_all_s" in m["timing_s"]
    assert refit["test_model"] == plain["test_model"]  # measured before the refit
    before = load_file(str(Path(plain["path"]) / "model.safetensors"))
    after = load_file(str(Path(refit["path"]) / "model.safetensors"))
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # then trained on more windows


@pytest.mark.parametrize("test_split_points", [1, 4])
def test_the_default_refit_learns_up_to_the_data_end(
    tiny_dataset: Path, tmp_path: Path, test_split_points: int
) -> None:
    """By default the published model learns every window whose label is complete by the data's last event
    day, beyond the test points too; the evaluation is the model's before it, which never saw the test
    windows; a scenario can switch it off."""
    shutil.copytree(tiny_dataset.parent / "data", tmp_path / "data")
    raw = yaml.safe_load(tiny_dataset.read_text())
    raw["data_params"]["test_split_points"] = test_split_points
    raw["scenarios"] = [
        {"name": "grocery", "task": "binary", "target": GROCERY},
        {"name": "as_evaluated", "task": "binary", "target": GROCERY, "refit_on_all": False},
    ]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(config)
    run_extract(cfg)
    cache = run_cache(cfg)
    run_pretrain(cfg)
    results = finetune_many(cfg, cfg.scenarios, NullProgress())
    m = json.loads((Path(results["grocery"]["path"]) / "metrics.json").read_text())
    windows, step = m["fit_windows"], dt.timedelta(days=raw["data_params"]["split_interval_days"])
    data_end = dt.date.fromisoformat(windows["data_end"])
    manifest = json.loads((Path(cache["path"]) / "manifest.json").read_text())
    assert data_end == dt.date.fromisoformat(manifest["sources"]["transactions"]["max_date"])
    newest = dt.date.fromisoformat(windows["published"]["newest_label_end"])
    assert newest <= data_end < newest + step  # no complete window left unlearned
    assert dt.date.fromisoformat(windows["evaluated"]["newest_label_end"]) <= cfg.data_params.validation_start
    assert max(m["test_split_points"]) < windows["published"]["last_split"] or test_split_points > 1
    assert m["refit"]["windows"].startswith("training + validation + test")
    assert ("newer complete windows" in m["refit"]["windows"]) == (test_split_points == 1)
    off = json.loads((Path(results["as_evaluated"]["path"]) / "metrics.json").read_text())
    assert "refit" not in off and off["fit_windows"]["published"] == off["fit_windows"]["evaluated"]
    assert off["test"] == pytest.approx(m["test"], nan_ok=True)  # the same evaluation either way


def test_small_data_fits_a_seed_ensemble_chosen_like_any_candidate_with_its_spread(refit_world) -> None:
    """60 households: the small data regime adds lightgbm_hybrid with BAG_SEEDS seeds, averaged; selection
    sees it beside the others and metrics.json reports what each seed scored."""
    from basemodel_pipeline.candidates.bagging import BAG_SEEDS

    _, results = refit_world
    m = json.loads((Path(results["grocery_neural"]["path"]) / "metrics.json").read_text())
    assert "lightgbm_hybrid_seeds" in m["selection"]["validation"]
    spread = m["seed_spread"]["lightgbm_hybrid_seeds"]
    assert spread["seeds"] == list(range(BAG_SEEDS))  # the scenario's seed (0), then 1, 2, ...
    for part in ("select", "test"):
        members = spread[part]["members"]
        assert len(members) == BAG_SEEDS and len(set(members)) > 1  # the seeds drew other rows and features
        assert spread[part]["range"] == pytest.approx(max(members) - min(members), abs=1e-5)
        assert spread[part]["std"] > 0
    assert spread["test"]["ensemble"] == pytest.approx(m["test"]["lightgbm_hybrid_seeds"])
    from basemodel_pipeline.reports.html import _seed_spread  # the report's section, from metrics.json

    section = _seed_spread(m)
    assert "<h2>Seed spread</h2>" in section and f"{spread['test']['mean']:.4f}" in section
