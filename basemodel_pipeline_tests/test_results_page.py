"""bench/RESULTS.md and the README's headline table are what bench/results_page.py writes from
bench/results/*.json, and they speak of results only."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import results_page  # noqa: E402

WORK_STAMPS = re.compile(r"\b(issues?|sessions?|sittings?|waves?|work items?)\b\W{0,3}\d*", re.IGNORECASE)


def test_the_committed_page_is_what_the_generator_writes() -> None:
    expected = results_page.render(results_page.load_results())
    assert results_page.PAGE.read_text() == expected, "bench/RESULTS.md is stale: run `make results`"


def test_the_readme_headline_is_what_the_generator_writes() -> None:
    readme = results_page.README.read_text()
    assert results_page.BEGIN in readme and results_page.END in readme
    headline = results_page.headline(results_page.load_results())
    assert results_page.with_headline(readme, headline) == readme, (
        "README's headline is stale: `make results`"
    )
    assert not [line for line in headline if WORK_STAMPS.search(line)]


def test_the_page_is_short_and_names_no_work_items_or_sittings() -> None:
    lines = results_page.PAGE.read_text().splitlines()
    # three real data sets and their defaults against references, three peer data sets, the stages: one
    # read, not a notebook
    most = 340
    assert len(lines) < most
    stamped = [line for line in lines if WORK_STAMPS.search(line)]
    assert not stamped, stamped


def _write(root: Path, name: str, data: dict) -> None:
    (root / name).write_text(json.dumps(data))


def test_missing_and_unknown_keys_leave_cells_out_and_invent_nothing(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "quality_onlineretail.json",
        {
            "dataset": "onlineretail",
            "date": "2026-12-06",
            "machine": "test machine",
            "churn_28d.metric": "auroc",
            "churn_28d.model": 0.81,
            "churn_28d.popularity": 0.7,
            "churn_28d.vs_popularity": 0.11,
            "churn_28d.vs_popularity_lo": 0.09,
            "churn_28d.vs_popularity_hi": 0.13,
            "churn_28d.vs_popularity_verdict": "win",
            "churn_28d.vs_neural": "not a number",
            "spend_28d.metric": "rmse",
            "spend_28d.mean_actual": 42.5,
            "spend_28d.mean_actual_95": "unexpected shape",
        },
    )
    _write(tmp_path, "peers_synthetic_small.json", {"dataset": "synthetic_small", "churn.metric": "auroc"})
    _write(tmp_path, "foundation_x.json", {"device": "cpu", "train_examples_per_s": 10.0})
    _write(tmp_path, "budget_x.json", {"benchmark": "budget", "x1.churn.neural": 0.7})
    _write(tmp_path, "scaling_x.json", {"1M.events": 1, "1M.extract.s": 2.0})
    _write(tmp_path, "something_new.json", {"answer": 42})
    (tmp_path / "broken.json").write_text("{not json")
    page = results_page.render(results_page.load_results(tmp_path))
    assert "### UCI Online Retail" in page
    assert "0.7: +0.1100 [+0.0900, +0.1300] **win**" in page
    assert "1 win, 0 ties, 0 losses out of 1 comparisons" in page
    assert "| spend_28d | GBP | 42.5 |" in page  # the interval of another shape is left out
    assert "`something_new.json`" in page  # a file no renderer knows is named, not rendered
    assert "answer" not in page
    assert "synthetic_small" not in page.split("## Other result files")[0]  # nothing to show: no heading
    assert "broken" not in page
    assert page == results_page.render(results_page.load_results(tmp_path))


def test_a_quality_file_renders_only_the_scenarios_and_baselines_it_holds(tmp_path: Path) -> None:
    keys = {"dataset": "completejourney", "churn.metric": "auroc", "churn.model": 0.86, "churn.command": "c"}
    for b, v in (("lightgbm_aggregates", 0.85), ("neural", 0.84)):
        keys |= {
            f"churn.{b}": v,
            f"churn.vs_{b}": 0.86 - v,
            f"churn.vs_{b}_lo": -0.01,
            f"churn.vs_{b}_hi": 0.03,
            f"churn.vs_{b}_verdict": "tie",
        }
    _write(tmp_path, "quality_completejourney.json", keys)
    page = results_page.render(results_page.load_results(tmp_path))
    header = next(line for line in page.splitlines() if line.startswith("| scenario | metric"))
    assert "vs LightGBM on aggregates" in header and "vs network alone" in header
    assert "popularity" not in header and "repeat" not in header
    assert "0 wins, 2 ties, 0 losses" in page
    assert "Runs: churn: `c`." in page


def test_a_file_of_an_unexpected_shape_leaves_the_others_of_its_section(tmp_path: Path) -> None:
    _write(tmp_path, "scaling_a.json", {"1M.events": 1, "5M.events": "five", "1M.extract.s": 2.0})
    _write(tmp_path, "scaling_b.json", {"1M.events": 1, "1M.entities": 10, "1M.extract.s": 3.5})
    page = results_page.render(results_page.load_results(tmp_path))
    assert "`bench/results/scaling_b.json`" in page and "3.5 s" in page
    assert "Earlier runs kept as files, not rendered here: `scaling_a.json`." in page


@pytest.mark.parametrize("line", ["issue 16 item 5", "session 11", "sitting 3", "Session's end"])
def test_the_stamp_pattern_catches_work_items(line: str) -> None:
    assert WORK_STAMPS.search(line)
