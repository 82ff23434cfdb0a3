"""Every task type end to end on the tiny dataset: targets, fine-tuning modes, baselines, report, predictions."""

from __future__ import annotations

import datetime as dt
import html
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import load_file

from basemodel_pipeline import workspace as ws
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import DataError, UserError
from basemodel_pipeline.inference.options import ScoringOptions
from basemodel_pipeline.pipeline import run_cache, run_extract, run_predict, run_pretrain
from basemodel_pipeline.progress import NullProgress
from basemodel_pipeline.reports.scenario import report_files
from basemodel_pipeline.scenarios.finetune import finetune, finetune_many
from basemodel_pipeline.tasks.recommendation import REPEAT_WEIGHTS

TARGET_MODULE = '''
import numpy as np

def big_spender(history, future, attributes, ctx):
    """Binary: spends more in the window than in the same number of days before the split."""
    if not ctx.window_complete:
        return None
    tx_f, tx_h = future["transactions"], history["transactions"].within_days(0, ctx.horizon_days)
    return float(tx_f.sum("sales_value") > tx_h.sum("sales_value"))

def departments(history, future, attributes, ctx):
    return future["transactions"].group_exists("department", list(ctx.classes))

def visits(history, future, attributes, ctx):
    return future["transactions"].filter("quantity", ">", 0).count()

def raises(history, future, attributes, ctx):
    raise KeyError("boom")

def wrong_shape(history, future, attributes, ctx):
    return np.zeros(3)

def nan(history, future, attributes, ctx):
    return float("nan")
'''

GROCERY_14D = {  # binary: any GROCERY purchase in the next 14 days
    "kind": "binary",
    "source": "transactions",
    "horizon_days": 14,
    "filter": [{"column": "department", "op": "==", "value": "GROCERY"}],
}
SCENARIOS = [
    {  # the network published: the scoring tests below check its paths (state, replay, int8, shards)
        "name": "grocery_buyer",
        "task": "binary",
        "target": GROCERY_14D,
        "publish": "neural",
    },
    {
        "name": "top_department",
        "task": "multiclass",
        "target": {
            "kind": "multiclass",
            "source": "transactions",
            "column": "department",
            "horizon_days": 14,
            "top_k": 4,
        },
    },
    {
        "name": "manufacturers",
        "task": "multilabel",
        "target": {
            "kind": "multilabel",
            "source": "transactions",
            "column": "manufacturer_id",
            "horizon_days": 14,
            "min_positive_entities": 0,
        },
        "lightgbm_top_labels": 3,
    },
    {
        "name": "spend",
        "task": "regression",
        "target": {
            "kind": "regression",
            "source": "transactions",
            "column": "sales_value",
            "horizon_days": 28,
            "log1p": True,
        },
        "mode": "lora",
        "lora_rank": 4,
    },
    {
        "name": "next_products",
        "task": "recommendation",
        "target": {
            "kind": "recommendation",
            "source": "transactions",
            "column": "product_id",
            "horizon_days": 14,
        },
        "mode": "full",
    },
    {
        "name": "next_products_sketch",
        "task": "recommendation",
        "target": {
            "kind": "recommendation",
            "source": "transactions",
            "column": "product_id",
            "horizon_days": 14,
            "next_basket": True,
            "decay": "sequential",
            "dense_max_items": 10,
            "sketch_partitions": 3,
            "sketch_width": 32,
        },
    },
    {  # a network that cannot learn (a learning rate of 1e-9): never published over the others
        "name": "grocery_weak_network",
        "task": "binary",
        "target": GROCERY_14D,
        "learning_rate": 1e-9,
        "epochs": 1,
    },
    {
        "name": "grocery_pinned",
        "task": "binary",
        "target": GROCERY_14D,
        "candidates": ["neural"],
        "publish": "lightgbm_aggregates",
    },
    {
        "name": "new_products",
        "task": "recommendation",
        "target": {
            "kind": "recommendation",
            "source": "transactions",
            "column": "product_id",
            "horizon_days": 14,
            "items": "new",
        },
    },
    {
        "name": "py_big_spender",
        "task": "binary",
        "target": {
            "kind": "python",
            "function": "tiny_targets:big_spender",
            "source": "transactions",
            "horizon_days": 14,
        },
    },
    {
        "name": "py_departments",
        "task": "multilabel",
        "target": {
            "kind": "python",
            "function": "tiny_targets:departments",
            "source": "transactions",
            "horizon_days": 14,
            "classes": ["GROCERY", "PRODUCE", "MEAT"],
        },
    },
    {
        "name": "py_visits",
        "task": "regression",
        "target": {
            "kind": "python",
            "function": "tiny_targets:visits",
            "source": "transactions",
            "horizon_days": 14,
        },
    },
]
BAD = {
    name: {
        "name": f"bad_{name}",
        "task": "regression",
        "target": {
            "kind": "python",
            "function": f"tiny_targets:{name}",
            "source": "transactions",
            "horizon_days": 14,
        },
    }
    for name in ("raises", "wrong_shape", "nan")
}


@pytest.fixture(scope="module")
def world(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("tasks")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    (d / "tiny_targets.py").write_text(TARGET_MODULE)
    sys.path.insert(0, str(d))
    raw = yaml.safe_load(tiny_dataset.read_text())
    raw["scenarios"] = SCENARIOS + list(BAD.values())
    # no production refit: the published model is the evaluated one, so replaying predict reproduces the test
    # metric (test_refit.py covers the refit)
    raw["training_params"]["finetune"]["refit_on_all"] = False
    (d / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(d / "config.yaml")
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    scenarios = [cfg.scenario(s["name"]) for s in SCENARIOS]
    results = finetune_many(cfg, scenarios, NullProgress(), report=report_files)  # as pipeline.py composes
    yield cfg, results
    sys.path.remove(str(d))


@pytest.mark.parametrize("name", [s["name"] for s in SCENARIOS])
def test_every_task_trains_evaluates_and_reports(world, name: str) -> None:
    cfg, results = world
    meta = results[name]
    metrics = json.loads((Path(meta["path"]) / "metrics.json").read_text())
    task = cfg.scenario(name).task
    assert set(metrics["test"]) >= {"model", "popularity"}
    assert np.isfinite(metrics["test"]["model"])
    assert metrics["published"] in metrics["selection"]["validation"]
    assert (
        metrics["test"]["model"] == metrics["test"][metrics["published"]]
    )  # the report measures what is published
    if task == "recommendation":
        repeat = set() if cfg.scenario(name).target.items == "new" else {"repeat_purchases"}
        assert {"model", "neural", "reranker", "popularity", "recent_popularity", *repeat} <= set(
            metrics["test_metrics"]
        )
        assert metrics["repeat_weight"] in REPEAT_WEIGHTS  # chosen on validation, stored with the model
        stored = json.loads((Path(meta["path"]) / "model.json").read_text())["target"]
        assert stored["repeat_weight"] == metrics["repeat_weight"]
        assert {"hitrate@10", "ndcg@10", "map@10", "recall@10", "precision@10", "mrr"} <= set(
            metrics["test_metrics"]["model"]
        )
    else:
        assert {"lightgbm_aggregates", "neural", "popularity"} <= set(metrics["test_metrics"])
    report = Path(meta["report_path"])
    assert report.parent == Path(meta["path"]) and report.exists()
    text = report.read_text()
    assert text.count("data:image/png;base64,") >= 2 and "<table>" in text and metrics["metric"] in text
    assert f"Candidates: published <code>{metrics['published']}</code>" in text  # and why, per candidate
    described = metrics["published_description"]  # what the published candidate is (Candidate.describe)
    assert described["name"] == metrics["published"] and described["inputs"]
    assert f"Published model: {html.escape(described['description'])}" in text
    assert metrics["regime"].startswith("small") and "Data regime" in text  # 60 households
    assert all(f"<th>{name}</th>" in text for name in metrics["selection"]["validation"])
    assert len(metrics["history"]) == meta["epochs"] >= 1


def test_several_scenarios_share_one_featurisation_pass(world) -> None:
    _, results = world
    assert len({r["featurise_s"] for r in results.values()}) == 1
    assert len({r["version"] for r in results.values()}) == len(results)  # but one checkpoint each


def test_multiclass_and_regression_outputs(world) -> None:
    cfg, results = world
    m = json.loads((Path(results["top_department"]["path"]) / "metrics.json").read_text())
    assert m["classes"] == 5  # 4 departments + "(other)"
    assert 0 <= m["test_metrics"]["model"]["accuracy"] <= m["test_metrics"]["model"]["top3_accuracy"] <= 1
    r = json.loads((Path(results["spend"]["path"]) / "metrics.json").read_text())
    assert r["metric"] == "rmse" and r["mode"] == "lora"
    assert {"rmse", "mae", "spearman", "rmse_raw", "mae_raw", "gini", "top_decile_lift"} <= set(
        r["test_metrics"]["model"]
    )


def test_a_log1p_amount_is_published_in_money(world) -> None:
    """Spend is learned on log1p but published as the expected amount: on the test windows the mean prediction
    lies within the 95% interval of the mean amount, where expm1 of the log-scale output falls far short."""
    cfg, results = world
    r = json.loads((Path(results["spend"]["path"]) / "metrics.json").read_text())
    amounts = r["amounts"]
    lo, hi = amounts["mean_actual_95"]
    assert lo <= amounts["mean_actual"] <= hi and amounts["mean_within_interval"]
    assert lo <= amounts["mean_predicted"] <= hi
    # the money map learns from every validation row, the early-stopping half of the entities too: a heavy-tailed
    # amount's level is not the luck of the selection half
    assert amounts["calibration_examples"] == r["examples"]["stop"] + r["examples"]["select"]
    for name, m in r["test_metrics"].items():  # every candidate's amounts are in money too
        assert m["mean_actual"] == pytest.approx(amounts["mean_actual"]), name
    cache, test = _test_examples(cfg, "spend")
    logs = replayed_test_scores(cfg, "spend", cache, test, column="value_log1p")
    assert np.sqrt(np.mean((logs - test.labels) ** 2)) == pytest.approx(r["test"]["model"], rel=1e-6)
    spec = json.loads((Path(results["spend"]["path"]) / "model.json").read_text())["target"]
    table = pq.read_table(run_predict(cfg, "spend")["path"])
    value, log_value = table.column("value").to_numpy(), table.column("value_log1p").to_numpy()
    np.testing.assert_allclose(value, np.interp(log_value, spec["money_x"], spec["money_y"]), rtol=1e-6)
    assert np.all(np.diff(value[np.argsort(log_value)]) >= -1e-9)  # the ranking is kept


def _test_examples(cfg, name: str):
    from basemodel_pipeline.cache.store import EventCache
    from basemodel_pipeline.features.sketch import FeatureEncoder
    from basemodel_pipeline.model.checkpoint import read_meta
    from basemodel_pipeline.scenarios.shared import Shared, prepare
    from basemodel_pipeline.workspace import cache_dir

    cache = EventCache(cache_dir(cfg))
    foundation = ws.latest_foundation_dir(cfg)
    fmeta = read_meta(foundation)
    shared = Shared(cfg, cache, fmeta, foundation, FeatureEncoder.from_dict(fmeta.encoder))
    return cache, prepare(shared, cfg.scenario(name))[1]["test"]


def test_a_network_that_cannot_learn_is_not_published_and_predict_scores_what_was_chosen(world) -> None:
    from basemodel_pipeline.evaluation.metrics import auroc

    cfg, results = world
    m = json.loads((Path(results["grocery_weak_network"]["path"]) / "metrics.json").read_text())
    val = m["selection"]["validation"]
    assert m["published"] != "neural" and val[m["published"]] > val["neural"]
    assert m["test"]["model"] > m["test"]["neural"]
    # the test windows of several test split points (14-day target: three fit in the tiny data set)
    assert len(m["test_split_points"]) == 3 and m["test_split_points"][0] == str(cfg.data_params.test_date)
    # predict, replayed as of each test split point, reproduces the published test metric
    cache, test = _test_examples(cfg, "grocery_weak_network")
    assert len(np.unique(test.time)) == 3
    scores = replayed_test_scores(cfg, "grocery_weak_network", cache, test)
    assert auroc(test.labels, scores) == pytest.approx(m["test"]["model"], abs=1e-9)


def test_a_pinned_candidate_is_published(world) -> None:
    _, results = world
    m = json.loads((Path(results["grocery_pinned"]["path"]) / "metrics.json").read_text())
    assert m["published"] == "lightgbm_aggregates" and m["selection"]["pinned"]
    assert "lightgbm_hybrid" not in m["test"]  # candidates: [neural] (+ the baselines)
    report = (Path(results["grocery_pinned"]["path"]) / "report.html").read_text()
    assert "published <code>lightgbm_aggregates</code> (pinned in the config)" in report


def test_only_new_items_are_never_items_the_entity_had(world) -> None:
    cfg, results = world
    m = json.loads((Path(results["new_products"]["path"]) / "metrics.json").read_text())
    # nothing of their own may be recommended, so "repeat what they bought" does not apply (it would be a copy of
    # the popular items they never had): not fitted, reported as not applicable
    assert m["test"]["repeat_purchases"] is None and "repeat_purchases" not in m["test_metrics"]
    assert "repeat_purchases" in m["not_applicable"]
    table = pq.read_table(run_predict(cfg, "new_products")["path"]).to_pandas()
    from basemodel_pipeline.cache.store import EventCache
    from basemodel_pipeline.workspace import cache_dir

    cache = EventCache(cache_dir(cfg))
    src = cache.source("transactions")
    items = np.array(src.vocab("product_id"), dtype=object)
    codes = np.asarray(src.columns["product_id"])
    owned = {
        eid: set(items[codes[src.offsets[i] : src.offsets[i + 1]] - 1])
        for i, eid in enumerate(cache.entity_ids)
    }
    assert len(table) and table["entity_id"].nunique() == cache.n_entities
    clash = [(e, i) for e, i in zip(table["entity_id"], table["item"], strict=True) if i in owned[e]]
    assert not clash


def test_multilabel_over_all_values_with_lightgbm_for_top_labels(world) -> None:
    cfg, results = world
    info = json.loads((Path(results["manufacturers"]["path"]) / "model.json").read_text())
    assert len(info["target"]["classes"]) == results["manufacturers"]["classes"] >= 10  # every manufacturer


def test_lora_is_merged_into_plain_trunk_weights(world) -> None:
    cfg, results = world
    weights = load_file(str(Path(results["spend"]["path"]) / "model.safetensors"))
    foundation = load_file(str(ws.latest_foundation_dir(cfg) / "model.safetensors"))
    trunk = {k for k in foundation if k.startswith("trunk.")}
    assert {k for k in weights if k.startswith("trunk.")} == trunk  # no adapter tensors left
    changed = [k for k in trunk if k.endswith(".weight") and not (weights[k] == foundation[k]).all()]
    assert "trunk.proj.weight" in changed  # the adapters were folded into the linear layers
    assert all((weights[k] == foundation[k]).all() for k in trunk if "norm" in k)  # only linears adapted


@pytest.mark.parametrize(
    ("name", "columns"),
    [
        ("grocery_buyer", {"entity_id", "as_of", "score"}),
        ("top_department", {"entity_id", "as_of", "label", "score"}),
        ("spend", {"entity_id", "as_of", "value", "value_log1p"}),
        ("next_products_sketch", {"entity_id", "as_of", "rank", "item", "score"}),
    ],
)
def test_predictions_per_task_type(world, name: str, columns: set[str]) -> None:
    cfg, _ = world
    meta = run_predict(cfg, name)
    table = pq.read_table(meta["path"])
    assert set(table.column_names) == columns
    n = meta["entities"]
    if name == "top_department":  # the full distribution: sums to 1 per entity
        df = table.to_pandas()
        np.testing.assert_allclose(df.groupby("entity_id")["score"].sum(), 1.0, rtol=1e-5)
    elif name == "spend":
        assert table.num_rows == n and (table.column("value").to_numpy() >= 0).all()
    elif name == "next_products_sketch":
        assert table.num_rows == n * 10
        df = table.to_pandas()
        assert (df.groupby("entity_id")["item"].nunique() == 10).all()
        assert (df.groupby("entity_id")["score"].apply(lambda s: s.is_monotonic_decreasing)).all()


def test_multilabel_predictions_top_k_and_threshold(world) -> None:
    cfg, _ = world
    table = pq.read_table(run_predict_k(cfg, top_k=2)).to_pandas()
    assert (table.groupby("entity_id").size() <= 3).all()  # 2, or more on exact ties
    table = pq.read_table(run_predict_k(cfg, threshold=0.999)).to_pandas()
    assert (table["score"] >= 0.999).all()


def run_predict_k(cfg, **kw) -> str:
    from basemodel_pipeline.inference.predict import predict

    return predict(cfg, cfg.scenario("manufacturers"), ScoringOptions(**kw), NullProgress())["path"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "raises",
            r"scenario 'bad_raises': target function tiny_targets:raises raised KeyError: 'boom' for entity \d+ at split \d{4}-\d\d-\d\d",
        ),
        (
            "wrong_shape",
            r"scenario 'bad_wrong_shape': target function tiny_targets:wrong_shape returned shape \(3,\); a regression target needs shape \(1,\) for entity \d+",
        ),
        ("nan", r"scenario 'bad_nan': target function tiny_targets:nan returned NaN or inf for entity \d+"),
    ],
)
def test_python_target_errors_name_scenario_and_entity(world, name: str, message: str) -> None:
    cfg, _ = world
    with pytest.raises(DataError, match=message):
        finetune(cfg, cfg.scenario(f"bad_{name}"), NullProgress())


def replayed_test_scores(cfg, name: str, cache, test, column: str = "score") -> np.ndarray:
    """What `predict` scores for each test example, replayed as of the example's split point (the test
    windows of every test split point: data_params.test_split_points)."""
    out = np.zeros(len(test.entity))
    for t in np.unique(test.time):
        day = dt.datetime.fromtimestamp(int(t), dt.UTC).date()
        scores = _scores(
            run_predict(cfg, name, ScoringOptions(as_of=day, precision="fp32", replay=True))["path"], column
        )
        rows = np.flatnonzero(test.time == t)
        out[rows] = [scores[i] for i in cache.entity_ids[test.entity[rows]]]
    return out


def _scores(path: str, column: str = "score") -> dict:
    table = pq.read_table(path)
    return dict(zip(table.column("entity_id").to_pylist(), table.column(column).to_pylist(), strict=True))


def test_latest_date_scoring_uses_the_state_and_matches_a_replay(world) -> None:
    cfg, _ = world
    state = run_predict(cfg, "grocery_buyer", ScoringOptions(precision="fp32"))
    assert state["features"] == "state" and state["state"] in ("built", "reused", "advanced")
    from_state = _scores(state["path"])
    replay = run_predict(cfg, "grocery_buyer", ScoringOptions(precision="fp32", replay=True))
    assert replay["features"] == "replay"
    from_history = _scores(replay["path"])
    assert from_state.keys() == from_history.keys()
    diff = np.abs(np.array(list(from_state.values())) - np.array([from_history[k] for k in from_state]))
    assert diff.max() < 5e-3  # the state holds float16 features
    assert run_predict(cfg, "grocery_buyer", ScoringOptions(precision="fp32"))["state"] == "reused"


def test_int8_scores_stay_close_to_fp32(world) -> None:
    cfg, _ = world
    fp32 = _scores(run_predict(cfg, "grocery_buyer", ScoringOptions(precision="fp32"))["path"])
    meta = run_predict(cfg, "grocery_buyer", ScoringOptions(precision="int8"))
    assert meta["precision"] == "int8"
    int8 = _scores(meta["path"])
    assert max(abs(fp32[k] - int8[k]) for k in fp32) < 0.05
    from basemodel_pipeline.inference.predict import Scorer

    model = Scorer.load(ws.latest_scenario_dir(cfg, "grocery_buyer"), "int8").model
    # the input projection stays float (its standardised input has outliers); the rest is int8
    assert type(model.trunk.proj) is torch.nn.Linear
    assert "quantized" in type(model.head).__module__
    assert all("quantized" in type(b.fc1).__module__ for b in model.trunk.blocks)


def test_subset_reports_unknown_ids_and_scores_the_rest(world, tmp_path: Path) -> None:
    cfg, _ = world
    everyone = _scores(run_predict(cfg, "grocery_buyer", ScoringOptions(precision="fp32"))["path"])
    known = [str(k) for k in list(everyone)[:3]]
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join([known[2], "no-such-id", known[0], "999999999"]))
    meta = run_predict(cfg, "grocery_buyer", ScoringOptions(precision="fp32", entities=ids))
    assert meta["entities"] == 2 and meta["rows"] == 2
    assert meta["unknown_entities"] == 2 and "no-such-id" in meta["unknown_examples"]
    got = _scores(meta["path"])
    assert list(got) == [int(known[2]), int(known[0])]  # request order
    assert all(abs(got[k] - everyone[k]) < 1e-6 for k in got)
    (tmp_path / "unknown.txt").write_text("x\ny\n")
    with pytest.raises(UserError, match="none of the 2 requested entity ids"):
        run_predict(cfg, "grocery_buyer", ScoringOptions(entities=tmp_path / "unknown.txt"))


def test_shards_merge_to_the_single_process_table(world, monkeypatch: pytest.MonkeyPatch) -> None:
    from basemodel_pipeline.inference import shards

    cfg, _ = world
    single = pq.read_table(run_predict(cfg, "top_department", ScoringOptions(precision="fp32"))["path"])
    monkeypatch.setattr(shards, "SHARD_ALIGN", 16)
    parts = [
        run_predict(cfg, "top_department", ScoringOptions(shard=(i, 3), precision="fp32")) for i in (2, 0, 1)
    ]
    assert sum(p["entities"] for p in parts) == len(single.column("entity_id").unique())
    merged = run_predict(cfg, "top_department", ScoringOptions(merge_shards=3))
    assert merged["shards"] == 3 and merged["rows"] == single.num_rows
    assert pq.read_table(merged["path"]).equals(single)
    provenance = ws.read_provenance(Path(merged["path"]).parent)  # what retention keeps for it
    assert provenance["scenario"] == "top_department"
    assert provenance["model_version"] == merged["model_version"]
    assert provenance["cache_history"]  # the cache content before as_of: what verify judges staleness by
    with pytest.raises(UserError, match="missing part-00000.parquet, part-00001"):
        run_predict(cfg, "top_department", ScoringOptions(merge_shards=4))


def test_predict_entrypoint_with_workers_matches_one_process(world) -> None:
    import os
    import subprocess

    cfg, _ = world
    single = pq.read_table(run_predict(cfg, "grocery_buyer", ScoringOptions(precision="fp32"))["path"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_PIPES")}
    cmd = [sys.executable, "-m", "basemodel_pipeline.entrypoints.predict", "--config",
           str(Path(cfg.workspace) / "config.yaml"), "--scenario", "grocery_buyer",
           "--precision", "fp32", "--workers", "2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("{") :])["metadata"]
    assert report["workers"] == 2 and report["shards"] == 2 and report["rows"] == single.num_rows
    assert pq.read_table(report["path"]).equals(single)


def test_predict_job_shard_runs_and_merge_run(world) -> None:
    """What one Dagster run per shard does: K runs with shard I/K, then one run with merge_shards K, each the
    entrypoint's stage with the arguments the asset's run config launches."""
    from basemodel_pipeline.defs.predictions.assets import ScoringConfig
    from basemodel_pipeline.entrypoints import _common
    from basemodel_pipeline.entrypoints.predict import stage

    cfg, _ = world
    single = pq.read_table(run_predict(cfg, "top_department", ScoringOptions(precision="fp32"))["path"])
    config = str(Path(cfg.workspace) / "config.yaml")

    def launched(**run_config: object) -> _common.EntrypointArgs:
        argv = ["--config", config, "--scenario", "top_department", *ScoringConfig(**run_config).to_argv()]
        ns = _common.parse_args(
            "predict", argv, scenario=True, as_of=False, source=False, scoring=ScoringOptions
        )
        return _common._entrypoint_args(ns, _common._LocalSession(), needs_scenario=True)

    for shard in ("1/2", "0/2"):
        stage(cfg, launched(precision="fp32", shard=shard), NullProgress())
    merged = stage(cfg, launched(merge_shards=2), NullProgress())
    assert pq.read_table(merged["path"]).equals(single)
    with pytest.raises(UserError, match="is not I/K"):
        stage(
            cfg,
            _common.EntrypointArgs(config, scoring=ScoringOptions.from_argv(["--shard", "half"])),
            NullProgress(),
        )
    with pytest.raises(UserError, match="^shard 2/2: write I/K with 0 <= I < K"):  # the library's names
        ScoringOptions.from_argv(["--shard", "2/2"])


def test_cli_predict_subset_summary_and_bad_shard(world, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from basemodel_pipeline.cli import app

    cfg, _ = world
    config = str(Path(cfg.workspace) / "config.yaml")
    ids = tmp_path / "ids.txt"
    table = pq.read_table(run_predict(cfg, "grocery_buyer")["path"])
    ids.write_text(f"{table.column('entity_id')[0].as_py()}\nnot-a-customer\n")
    result = CliRunner().invoke(app, ["predict", config, "-s", "grocery_buyer", "--entities", str(ids)])
    assert result.exit_code == 0, result.output
    assert "unknown_entities" in result.output and "not-a-customer" in result.output
    bad = CliRunner().invoke(app, ["predict", config, "-s", "grocery_buyer", "--shard", "3/2"])
    assert bad.exit_code == 2 and "--shard 3/2: write I/K with 0 <= I < K" in bad.output  # the CLI's flags


def test_predict_refuses_a_checkpoint_of_another_definition(world, tmp_path: Path) -> None:
    """A second config sharing the workspace (here: grocery_buyer with another horizon) must not score the
    first config's model under its name, nor overwrite its predictions."""
    cfg, _ = world
    raw = yaml.safe_load((Path(cfg.workspace) / "config.yaml").read_text())
    for sc in raw["scenarios"]:
        if sc["name"] == "grocery_buyer":
            sc["target"]["horizon_days"] = 7
    other = Path(cfg.workspace) / "other_config.yaml"
    other.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(
        UserError, match=r"scenario 'grocery_buyer': its newest checkpoint .*differs in: target"
    ):
        run_predict(load_config(other), "grocery_buyer")
