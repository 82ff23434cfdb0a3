"""Integrated-gradients explanations on a small trained workspace with a planted signal.

Half the people ("callers") use the phone channel for ~60% of their events, the others never; the binary
scenario `phones` is "uses the phone in the next 14 days", so the `channel` column drives the score. `item`
(100 values) is a hashed column, `segment` a main-entity attribute, both noise.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from typer.testing import CliRunner

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.cli import app
from basemodel_pipeline.config import load_config
from basemodel_pipeline.dates import epoch_seconds
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.features.names import ATTRIBUTES, describe
from basemodel_pipeline.features.sketch import FeatureEncoder
from basemodel_pipeline.inference.attributions import OTHER_BUCKETS, HashedValues
from basemodel_pipeline.inference.explain import (
    Explainer,
    Model,
    baseline_features,
    choose_output,
    explain,
    integrated_gradients,
)
from basemodel_pipeline.inference.predict import default_as_of
from basemodel_pipeline.pipeline import run_cache, run_extract, run_pretrain
from basemodel_pipeline.progress import NullProgress
from basemodel_pipeline.reports.explanations import REPORT_POPULATION, add_report_explanation, run_explain
from basemodel_pipeline.reports.html import with_explanation
from basemodel_pipeline.scenarios.finetune import finetune_many
from basemodel_pipeline.scenarios.shared import Shared, prepare
from basemodel_pipeline.workspace import cache_dir

N, DAYS, START = 200, 112, dt.date(2024, 1, 1)
runner = CliRunner()


def _write(d: Path) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(0)
    caller = rng.random(N) < 0.5
    ent, day = np.nonzero(rng.random((N, DAYS)) < 0.3)
    phone = caller[ent] & (rng.random(len(ent)) < 0.6)
    channel = np.where(phone, "phone", np.array(["web", "store", "app"])[rng.integers(0, 3, len(ent))])
    ts = np.datetime64(START, "s") + (day * 86400 + 12 * 3600).astype("timedelta64[s]")
    (d / "data").mkdir(parents=True)
    events = {
        "person_id": (ent + 1).astype(np.int64),
        "ts": ts.astype("datetime64[us]"),
        "channel": channel,
        "item": [f"item{i:03d}" for i in rng.integers(0, 100, len(ent))],
        "amount": np.round(rng.lognormal(1, 0.5, len(ent)), 2),
    }
    pq.write_table(pa.table(events), d / "data" / "events.parquet")
    people = {
        "person_id": np.arange(1, N + 1, dtype=np.int64),
        "segment": np.array(["a", "b", "c"])[rng.integers(0, 3, N)],
    }
    pq.write_table(pa.table(people), d / "data" / "people.parquet")
    parquet = {"database_type": "parquet"}
    window = {"source": "events", "horizon_days": 14}
    cfg = {
        "workspace": ".",
        "data_sources": [
            {"type": "event", "name": "events", "data_location": {**parquet, "path": "data/events.parquet"},
             "main_entity_column": "person_id", "date_column": {"name": "ts"}},
            {"type": "main_entity_attribute", "name": "people", "main_entity_column": "person_id",
             "data_location": {**parquet, "path": "data/people.parquet"}},
        ],
        "data_params": {
            "data_start_date": START,
            "training_start_date": START + dt.timedelta(days=28),
            "validation_start_date": START + dt.timedelta(days=70),
            "training_end_date": START + dt.timedelta(days=DAYS - 16),
            "split_interval_days": 7,
        },
        "training_params": {
            "foundation": {"horizon_days": 14, "epochs": 2, "hidden_dim": 32, "num_blocks": 1,
                           "sketch_width": 8, "max_direct_vocab": 8, "aggregate_features": False,
                           "split_points_per_entity": 2, "batch_size": 64},
            "finetune": {"epochs": 15, "batch_size": 64, "patience": 15, "mode": "full", "learning_rate": 0.003},
        },
        "scenarios": [
            {"name": "phones", "task": "binary",
             "target": {"kind": "binary", **window, "filter": [{"column": "channel", "value": "phone"}]}},
            {"name": "channels", "task": "multilabel",
             "target": {"kind": "multilabel", **window, "column": "channel", "min_positive_entities": 1}},
            {"name": "spend", "task": "regression",
             "target": {"kind": "regression", **window, "column": "amount", "log1p": True}},
        ],
        "quality_gates": {"metric_floor": 0.0, "popularity_margin": None},  # explained whatever they score
    }  # fmt: skip
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return d / "config.yaml", caller


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    path, caller = _write(tmp_path_factory.mktemp("explain"))
    cfg = load_config(path)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    results = finetune_many(cfg, list(cfg.scenarios), NullProgress())
    assert results["phones"]["test_model"] > 0.9  # the planted signal is learned
    return path, cfg, caller


def _inputs(cfg, scenario: str, n: int = 40):
    cache = EventCache(cache_dir(cfg))
    m = Model.load(ws.latest_scenario_dir(cfg, scenario))
    e = np.arange(n, dtype=np.int64)
    t = np.full(n, epoch_seconds(default_as_of(cache)), np.int64)
    return cache, m, e, t, m.enc.history(cache, e, t)


def test_feature_names_cover_every_input(world) -> None:
    _, cfg, _ = world
    cache, m, *_ = _inputs(cfg, "phones", 1)
    features = describe(m.enc, cache)
    assert [f.index for f in features] == list(range(m.enc.dim))
    channel = {f.value for f in features if f.column == "channel"}
    assert {"phone", "web", "store", "app", "(missing)"} == channel
    item = [f for f in features if f.column == "item"]
    assert {f.kind for f in item} == {"hashed"} and item[0].value == "partition 0 bucket 0"
    assert {f.half_life_days for f in item} == set(m.enc.half_lives_days)
    assert {f.value for f in features if f.group == ATTRIBUTES} == {"(missing)", "a", "b", "c"}
    assert [f.column for f in features if f.kind == "extra"][:2] == ["log count", "log recency days"]
    # the encoder's block offsets point where the names say each block starts
    for name, start in m.enc.source_offsets().items():
        assert features[start].group == name and (start == 0 or features[start - 1].group != name)
    assert features[m.enc.attribute_offset].group == ATTRIBUTES
    assert features[m.enc.attribute_offset - 1].group != ATTRIBUTES
    assert m.enc.aggregate_offset + m.enc.aggregate_dim == m.enc.dim


@pytest.mark.parametrize("baseline", ["mean", "empty"])
@pytest.mark.parametrize("scenario", ["phones", "channels", "spend"])
def test_completeness(world, scenario: str, baseline: str) -> None:
    """Attributions add up to f(x) - f(baseline); 32 steps already come close, refinement closes the rest."""
    _, cfg, _ = world
    cache, m, e, t, X = _inputs(cfg, scenario)
    with torch.no_grad():
        scores = m.task.scores(m.model(torch.from_numpy(X)).numpy())
    output = choose_output(m.task, None, scores)
    base = baseline_features(baseline, cache, m, e, t)
    A, fx, fb = integrated_gradients(output.fn(m.model), X, base, steps=128)
    gap = fx - fb - A.astype(np.float64).sum(1)
    assert np.abs(gap).max() <= 1e-3 * (1 + np.abs(fx - fb).max()), np.abs(gap).max()
    # the same integral taken in the hidden space after the affine input layer (what explain() runs)
    first, rest = output.split(m.model)
    A2, fx2, fb2 = integrated_gradients(rest, X, base, steps=128, first=first)
    # float32 through the same layers in another grouping: differences of ~1e-4 occur (1.4e-4 seen)
    np.testing.assert_allclose(fx2, fx, rtol=1e-3, atol=5e-4)
    np.testing.assert_allclose(fb2, fb, rtol=1e-3, atol=5e-4)
    np.testing.assert_allclose(A2, A, rtol=1e-3, atol=1e-4 * np.abs(A).max())
    out = run_explain(cfg, cfg.scenario(scenario), entity_id="7", baseline=baseline)
    c = out["completeness"]
    assert abs(c["gap"]) <= 1e-3 * (1 + abs(c["output"] - c["baseline_output"]))
    assert c["sum_of_attributions"] == pytest.approx(sum(s["attribution"] for s in out["sources"]), abs=1e-6)


def test_planted_signal_gets_the_largest_attribution(world) -> None:
    _, cfg, caller = world
    cache, m, *_ = _inputs(cfg, "phones", 1)
    t = np.array([epoch_seconds(default_as_of(cache))])
    checked = {"caller": 0, "other": 0}
    for idx in range(30):
        out = explain(cache, m, cache.entity_index(np.array([idx + 1])), t)
        top, score = out["columns"][0], out["output"]["score"]
        if caller[idx] and score > 0.8:
            assert (top["source"], top["column"]) == ("events", "channel"), out["columns"][:3]
            assert top["attribution"] > 0
            phone = next(v for v in out["values"] if v["column"] == "channel" and v["value"] == "phone")
            assert phone["attribution"] > 0
            checked["caller"] += 1
        elif not caller[idx] and score < 0.2:
            assert (top["source"], top["column"]) == ("events", "channel"), out["columns"][:3]
            assert top["attribution"] < 0
            checked["other"] += 1
    assert min(checked.values()) >= 5, checked


def test_hashed_values_split_their_buckets(world) -> None:
    """With the empty baseline, a hashed column's attribution is shared exactly among the entity's values."""
    _, cfg, _ = world
    cache, m, e, t, X = _inputs(cfg, "phones", 1)
    ex = Explainer(cache, m.enc)
    fn = choose_output(m.task, None, None).fn(m.model)
    A, *_ = integrated_gradients(fn, X, baseline_features("empty", cache, m, e, t))
    ex.add(A, e, t)
    items = next(v for v in ex.tables if isinstance(v, HashedValues) and v.column == "item")
    column = A[0, items.features].sum()
    assert items.sum.sum() == pytest.approx(column, abs=1e-6)
    assert abs(items.sum[-1]) < 1e-6 * max(1.0, abs(column))  # nothing left for unused buckets
    src = cache.source("events")
    own = set(np.asarray(src.columns["item"][src.offsets[0] : src.offsets[1]]).tolist())
    assert set(np.flatnonzero(items.sum[:-1]).tolist()) <= own
    result = ex.result()
    item_values = [v["value"] for v in result["values"] if v["column"] == "item"]
    assert item_values and all(v.startswith("item") for v in item_values)


def test_mean_baseline_reports_unused_buckets(world) -> None:
    _, cfg, _ = world
    out = run_explain(cfg, cfg.scenario("phones"), entity_id="3", baseline="mean")
    assert any(v["value"] == OTHER_BUCKETS for v in out["values"] if v["column"] == "item")


def test_unknown_entity_and_class_are_user_errors(world) -> None:
    path, cfg, _ = world
    with pytest.raises(UserError, match="'no-such-id'"):
        run_explain(cfg, cfg.scenario("phones"), entity_id="no-such-id")
    with pytest.raises(UserError, match="^label 'nope': is not a class of this scenario.*phone"):
        run_explain(cfg, cfg.scenario("channels"), entity_id="1", label="nope")
    with pytest.raises(UserError, match="^label: a binary scenario has one output"):
        run_explain(cfg, cfg.scenario("phones"), entity_id="1", label="phone")
    result = runner.invoke(app, ["explain", str(path), "-s", "phones", "--entity", "no-such-id"])
    assert result.exit_code == 2 and "--entity 'no-such-id': is not an entity" in result.stderr
    result = runner.invoke(app, ["explain", str(path), "-s", "channels", "--entity", "1", "--class", "nope"])
    assert result.exit_code == 2 and "--class 'nope': is not a class" in result.stderr


def test_cli_entity_writes_json_and_plot(world) -> None:
    path, cfg, _ = world
    result = runner.invoke(app, ["explain", str(path), "-s", "channels", "--entity", "2", "--class", "phone"])
    assert result.exit_code == 0, (result.output, result.exception)
    as_of = default_as_of(EventCache(cache_dir(cfg))).isoformat()
    out_dir = ws.root(cfg) / "explanations" / "channels" / as_of
    data = json.loads((out_dir / "entity-2.json").read_text())
    assert data["entity_id"] == "2" and data["output"]["class"] == "phone" and data["task"] == "multilabel"
    assert (out_dir / "entity-2.png").read_bytes()[:4] == b"\x89PNG"
    assert {"sources", "columns", "values", "features", "completeness"} <= set(data)
    assert "channel" in result.output and "entity-2.json" in result.output.replace("\n", "")


def test_population(world) -> None:
    path, cfg, _ = world
    result = runner.invoke(app, ["explain", str(path), "-s", "phones", "--population", "60"])
    assert result.exit_code == 0, (result.output, result.exception)
    as_of = default_as_of(EventCache(cache_dir(cfg))).isoformat()
    data = json.loads((ws.root(cfg) / "explanations" / "phones" / as_of / "population.json").read_text())
    assert data["entities"] == 60 and "entity_id" not in data
    assert {s["source"] for s in data["sources"]} == {"events", "attributes"}
    assert data["columns"][0]["column"] == "channel"
    assert all(r["mean_abs_attribution"] >= abs(r["mean_attribution"]) - 1e-12 for r in data["columns"])
    assert data["completeness"]["max_abs_gap"] < 1e-2 * (1 + data["completeness"]["mean_abs_output_change"])
    report = with_explanation("<html><body><h1>x</h1></body></html>", data)
    assert "What drives the model" in report and report.count("data:image/png;base64,") == 1
    assert report.endswith("</body></html>")


def test_report_explanation_from_finetune_state(world) -> None:
    """add_report_explanation works on what scenarios/finetune._finish holds (Shared, model, task, test)."""
    from basemodel_pipeline.model.checkpoint import read_meta

    _, cfg, _ = world
    cache = EventCache(cache_dir(cfg))
    foundation = ws.latest_foundation_dir(cfg)
    fmeta = read_meta(foundation)
    shared = Shared(cfg, cache, fmeta, foundation, FeatureEncoder.from_dict(fmeta.encoder))
    _, ex = prepare(shared, cfg.scenario("phones"))
    shared.featurise(list(ex.values()))
    m = Model.load(ws.latest_scenario_dir(cfg, "phones"))
    extra = {"report.html": "<html><body><h1>phones</h1></body></html>"}
    add_report_explanation(extra, shared, m.model, m.task, ex["test"])
    expl = json.loads(extra["explanation.json"])
    assert expl["entities"] == min(len(ex["test"]), REPORT_POPULATION)
    assert expl["columns"][0]["column"] == "channel"
    assert (
        "What drives the model" in extra["report.html"] and "data:image/png;base64," in extra["report.html"]
    )
    assert not m.model.training  # left as it was


def test_explain_on_a_workspace_it_cannot_write(world, tmp_path: Path) -> None:
    """explain only reads the workspace: where its explanations directory cannot be made (here a file stands
    where it goes, which stops root too), the explanation is still computed and shown, its files go to a
    temporary directory, and one warning line names both directories."""
    path, cfg, _ = world
    explanations = ws.root(cfg) / "explanations"
    aside = tmp_path / "explanations"
    if explanations.exists():
        shutil.move(explanations, aside)
    explanations.write_text("a file where the directory goes")
    try:
        result = runner.invoke(app, ["explain", str(path), "-s", "phones", "--entity", "3"])
        assert explanations.is_file()
    finally:
        explanations.unlink()
        if aside.exists():
            shutil.move(aside, explanations)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "Traceback" not in result.output and "channel" in result.stdout
    warning = " ".join(result.stderr.split())  # unwrapped
    assert warning.count("warning:") == 1 and "error" not in warning, warning
    assert (
        f"warning: {explanations / 'phones'}/" in warning and "cannot be written (not a directory)" in warning
    )
    written = Path(warning.split(" written to ")[1].split()[0])
    assert not written.is_relative_to(ws.root(cfg))
    data = json.loads((written / "entity-3.json").read_text())
    assert data["entity_id"] == "3" and (written / "entity-3.png").read_bytes()[:4] == b"\x89PNG"
    shutil.rmtree(written)
