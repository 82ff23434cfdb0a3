"""Staged baselines: the candidates a scenario fits without its network, fitted once in a CPU step and saved
for the fine-tuning step to read instead of fitting them again (docs/scenarios.md, "Where the work runs").

    <workspace>/staging/baselines/<scenario>/<key>/
        stage.json            key, the rows' digest, each candidate's saved meta, file names and fit seconds
        files/<name>/<file>   each candidate's saved files (LightGBM model text, safetensors): no pickle
        select/<name>.npy     its outputs on the validation `select` rows (the comparison)
        test/<name>.npy       its outputs on the test rows (the report)

``key`` hashes everything the staged candidates depend on: the cache's data_version, the foundation's feature
encoder (the aggregates LightGBM reads are the last block of its inputs), the scenario's config (and a Python
target's source), the resolved split windows, the seed and the library code that fits them. Another cache,
an edited scenario or new code is another key, so a stale stage is never read; ``read`` also checks that the
stage was made from exactly the rows being evaluated. A stage is written to a hidden directory and renamed
into place (readers see all of it or nothing); older keys of the scenario are removed, the newest
``KEEP_STAGES`` kept.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from basemodel_pipeline import files as fs
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.candidates.base import Candidate, Context
from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.candidates.loading import load_candidate
from basemodel_pipeline.config import PipelineConfig, Scenario
from basemodel_pipeline.progress import Progress

KEEP_STAGES = 2  # stages kept per scenario (the newest keys)
FORMAT = 1
# library code the staged candidates' content depends on (packages or modules of basemodel_pipeline)
CODE = (
    "cache",
    "candidates",
    "config",
    "evaluation",
    "features",
    "scenarios",
    "targets",
    "tasks",
    "training",
)
PACKAGE = Path(__file__).resolve().parent.parent


@functools.cache
def code_version() -> str:
    """Hash of the library source the baselines are computed with."""
    digest = hashlib.sha256()
    for part in CODE:
        for file in sorted((PACKAGE / part).rglob("*.py")):
            digest.update(file.relative_to(PACKAGE).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def stage_key(cfg: PipelineConfig, scenario: Scenario, cache_version: str, encoder: dict[str, Any]) -> str:
    """The key of a scenario's stage (see the module docstring); `cfg` has its windows resolved."""
    from basemodel_pipeline.targets.python import function_source

    source = function_source(scenario)  # a Python target's; None for a declarative one
    inputs = {
        "format": FORMAT,
        "cache": cache_version,
        "encoder": encoder,
        "scenario": scenario.model_dump(mode="json"),
        "target_source": source,
        "data_params": cfg.data_params.model_dump(mode="json"),
        "seed": cfg.training_params.finetune.seed,
        "caps": [
            cfg.training_params.finetune.max_train_examples,
            cfg.training_params.finetune.max_validation_examples,
            cfg.training_params.finetune.max_test_examples,
        ],
        "code": code_version(),
    }
    payload = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def stage_root(cfg: PipelineConfig, scenario: str) -> Path:
    return ws.root(cfg) / "staging" / "baselines" / scenario


def stage_path(cfg: PipelineConfig, scenario: str, key: str) -> Path:
    return stage_root(cfg, scenario) / key


def rows_digest(parts: dict[str, Rows]) -> str:
    """Hash of the (entity, time) rows of each part (train, stop, select, test), in order."""
    digest = hashlib.sha256()
    for name in sorted(parts):
        rows = parts[name]
        digest.update(name.encode() + b"\0" + str(len(rows)).encode())
        digest.update(np.ascontiguousarray(rows.entity, np.int64).tobytes())
        digest.update(np.ascontiguousarray(rows.time, np.int64).tobytes())
    return digest.hexdigest()[:20]


@dataclass
class Stage:
    """Fitted baselines of one scenario: saved models, outputs on the select and test rows, fit seconds."""

    key: str
    digest: str
    saved: dict[str, tuple[dict[str, Any], dict[str, bytes]]] = field(default_factory=dict)
    select: dict[str, np.ndarray] = field(default_factory=dict)
    test: dict[str, np.ndarray] = field(default_factory=dict)
    fit_s: dict[str, float] = field(default_factory=dict)

    def candidates(self, ctx: Context) -> dict[str, Candidate]:
        """The fitted candidates, loaded as `predict` loads a published one (for the blend, refit, save)."""
        return {name: load_candidate(meta, files, ctx) for name, (meta, files) in self.saved.items()}


def fit_baselines(
    key: str, candidates: dict[str, Candidate], rows: dict[str, Rows], progress: Progress, scenario: str
) -> Stage:
    """Fit `candidates` on rows["train"] (early stopping on rows["stop"]) and score rows["select"] and
    rows["test"]."""
    stage = Stage(key, rows_digest(rows))
    for name, cand in candidates.items():
        t0 = time.perf_counter()
        progress.log(f"{scenario}: fitting baseline {name} on {len(rows['train']):,} training examples")
        cand.fit(rows["train"], rows["stop"])
        stage.fit_s[name] = round(time.perf_counter() - t0, 2)
        progress.log(f"{scenario}: {name} fitted in {stage.fit_s[name]} s")
        stage.saved[name] = cand.save()
        stage.select[name] = np.asarray(cand.predict(rows["select"]))
        stage.test[name] = np.asarray(cand.predict(rows["test"]))
    return stage


def write(stage: Stage, path: Path) -> None:
    """Write the stage to `path` atomically and remove the scenario's older stages (KEEP_STAGES kept)."""
    tmp = fs.staging_dir(path)
    try:
        meta: dict[str, Any] = {"format": FORMAT, "key": stage.key, "digest": stage.digest, "candidates": {}}
        for name, (cand_meta, files) in stage.saved.items():
            for file, data in files.items():
                target = tmp / "files" / name / file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            meta["candidates"][name] = {"meta": cand_meta, "files": sorted(files), "fit_s": stage.fit_s[name]}
            for part, outputs in (("select", stage.select), ("test", stage.test)):
                (tmp / part).mkdir(exist_ok=True)
                np.save(tmp / part / f"{name}.npy", outputs[name], allow_pickle=False)
        (tmp / "stage.json").write_text(json.dumps(meta, indent=2))
        fs.publish_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(path)


def _prune(keep: Path) -> None:
    """Remove the scenario's stages beyond the newest KEEP_STAGES (never `keep`, never hidden entries)."""
    stages = [p for p in keep.parent.iterdir() if p.is_dir() and not p.name.startswith(".") and p != keep]
    stages.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in stages[KEEP_STAGES - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def read(path: Path, digest: str | None = None) -> Stage | None:
    """The stage at `path`, or None when there is none (or it was made from other rows than `digest`)."""
    manifest = path / "stage.json"
    if not manifest.is_file():
        return None
    meta = json.loads(manifest.read_text())
    if meta.get("format") != FORMAT or (digest is not None and meta["digest"] != digest):
        return None
    stage = Stage(meta["key"], meta["digest"])
    for name, info in meta["candidates"].items():
        files = {f: (path / "files" / name / f).read_bytes() for f in info["files"]}
        stage.saved[name] = (info["meta"], files)
        stage.fit_s[name] = float(info["fit_s"])
        stage.select[name] = np.load(path / "select" / f"{name}.npy", allow_pickle=False)
        stage.test[name] = np.load(path / "test" / f"{name}.npy", allow_pickle=False)
    return stage


def staged_for(
    cfg: PipelineConfig, scenario: Scenario, key: str, rows: dict[str, Rows], progress: Progress
) -> tuple[Stage | None, dict[str, Any]]:
    """The scenario's staged baselines for exactly these inputs (`key`) and rows, or None (then fitted inline),
    with what the metrics record of them."""
    path = stage_path(cfg, scenario.name, key)
    stage = read(path, rows_digest(rows))
    if stage is None:
        progress.log(f"{scenario.name}: no staged baselines for key {key}: fitting them here")
        return None, {"reused": False, "key": key}
    progress.log(f"{scenario.name}: baselines {', '.join(stage.saved)} read from {path}")
    return stage, {"reused": True, "key": key, "fit_s": stage.fit_s}  # no path: checkpoints stay movable
