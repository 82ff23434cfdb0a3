"""Explanations as files and as a report section: `basemodel explain` writes one entity's or a population's
attributions (inference/explain.py) as JSON and a PNG chart under <workspace>/explanations/, and fine-tuning
adds a population explanation of the test examples to the scenario report (reports/html.py).

Explaining only reads the workspace: where <workspace>/explanations/ cannot be written (a read-only volume,
a file where the directory goes), the files go to a new temporary directory and the result says so."""

from __future__ import annotations

import datetime as dt
import errno
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from basemodel_pipeline import files as fs
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.dates import epoch_seconds
from basemodel_pipeline.errors import ArgumentError
from basemodel_pipeline.inference.explain import (
    DEFAULT_POPULATION,
    DEFAULT_STEPS,
    Model,
    explain,
    sample_entities,
)
from basemodel_pipeline.inference.predict import default_as_of
from basemodel_pipeline.model.trunk import TrunkWithHead
from basemodel_pipeline.reports.html import explanation_png, with_explanation
from basemodel_pipeline.tasks import Task
from basemodel_pipeline.workspace import cache_dir

REPORT_POPULATION = 256  # test entities explained for the scenario report
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST)


def writable_dir(path: Path) -> tuple[Path, str | None]:
    """`path` (made when missing) if a file can be created in it, with None; else a new temporary directory
    and why `path` cannot be used."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            return path, None
    except OSError as exc:
        if exc.errno not in NOT_WRITABLE:
            raise
        reason = (exc.strerror or "not writable").lower()
        return Path(tempfile.mkdtemp(prefix="basemodel-explain-")), f"{path} cannot be written ({reason})"


def _file_stem(entity_id: str) -> str:
    return "entity-" + re.sub(r"[^A-Za-z0-9_.-]", "_", entity_id)[:100]


def run_explain(
    cfg: PipelineConfig,
    scenario: Scenario,
    entity_id: str | None = None,
    as_of: dt.date | None = None,
    population: int = DEFAULT_POPULATION,
    label: str | None = None,
    steps: int = DEFAULT_STEPS,
    baseline: str = "mean",
) -> dict[str, Any]:
    """Explain one entity (entity_id) or a population sample of the latest scenario model as of a date;
    writes <workspace>/explanations/<scenario>/<as_of>/{entity-<id>,population}.{json,png} (elsewhere, with
    result["warning"] saying where, when that directory cannot be written)."""
    cache = EventCache(cache_dir(cfg))
    m = Model.load(ws.latest_scenario_dir(cfg, scenario.name))
    as_of = as_of or default_as_of(cache)
    if as_of <= cfg.data_params.data_start_date:
        raise ArgumentError("as_of", as_of, f"is before data_start_date ({cfg.data_params.data_start_date})")
    if population <= 0:
        raise ArgumentError("population", population, "give a positive number of entities")
    if entity_id is not None:
        try:
            idx = int(cache.entity_index(np.array([entity_id]))[0])
        except ValueError:  # not even of the ids' type (text for integer ids)
            idx = -1
        if idx < 0:
            some = ", ".join(str(i) for i in cache.entity_ids[:5])
            raise ArgumentError(
                "entity_id",
                repr(entity_id),
                f"is not an entity of the event cache at {cache.path} ({cache.n_entities} entities, e.g. {some})",
            )
        entity, stem = np.array([idx], np.int64), _file_stem(entity_id)
    else:
        entity, stem = sample_entities(cache.n_entities, population), "population"
    t = np.full(len(entity), epoch_seconds(as_of), np.int64)
    result = explain(cache, m, entity, t, label, steps, baseline)
    result = {
        "scenario": scenario.name,
        "as_of": as_of.isoformat(),
        "model_version": m.meta.version if m.meta else None,
        **({"entity_id": entity_id} if entity_id is not None else {}),
        **result,
    }
    out_dir, unwritable = writable_dir(ws.root(cfg) / "explanations" / scenario.name / as_of.isoformat())
    json_path, png_path = out_dir / f"{stem}.json", out_dir / f"{stem}.png"
    result["json_path"], result["plot_path"] = str(json_path), str(png_path)
    if unwritable:
        result["warning"] = f"{unwritable}; the explanation's JSON and plot were written to {out_dir} instead"
    fs.atomic_write_bytes(png_path, explanation_png(result))
    fs.atomic_write_text(json_path, json.dumps(result, indent=2))
    return result


def add_report_explanation(
    extra: dict[str, str], shared: Any, model: TrunkWithHead, task: Task, test: Any
) -> None:
    """For scenarios/finetune._finish: explain up to REPORT_POPULATION test examples (population, mean
    baseline), add the section to extra["report.html"] and the JSON as extra["explanation.json"].

    shared: scenarios.shared.Shared (cache, enc, X, rows()); test: the test Examples. Recommendation: nothing."""
    if not task.explainable or len(test) == 0:
        return
    pick = sample_entities(len(test), REPORT_POPULATION)
    X = shared.X[shared.rows(test)[pick]].astype(np.float32)
    expl = explain(shared.cache, Model(model, shared.enc, task), test.entity[pick], test.time[pick], X=X)
    extra["report.html"] = with_explanation(extra["report.html"], expl)
    extra["explanation.json"] = json.dumps(expl, indent=2)
