"""Workspace layout: where each artifact of a config's workspace lives. The file primitives that write and
check them (atomic writes, staging, version names and LATEST, manifests, locks) are files.py, manifests.py and
locks.py, which know no layout.

<workspace>/extracts/<source>/<yyyy-mm-dd>.parquet | table.parquet
<workspace>/cache/<fingerprint>/
<workspace>/checkpoints/foundation/<version>/        LATEST names the version served (promoted)
<workspace>/checkpoints/foundation/verdicts/<version>.json   why a version was promoted or rejected
<workspace>/checkpoints/scenarios/<name>/<version>/  LATEST and verdicts/ likewise
<workspace>/predictions/<scenario>/<as_of>/predictions.parquet   + provenance.json
<workspace>/embeddings/<as_of>/embeddings.parquet                 + provenance.json
<workspace>/reports/summary.json

provenance.json names the checkpoint versions an output was made from (retention keeps those).
"""

from __future__ import annotations

import json
from pathlib import Path

from basemodel_pipeline.config import PipelineConfig, data_fingerprint
from basemodel_pipeline.files import latest


def root(cfg: PipelineConfig) -> Path:
    return Path(cfg.workspace)


def extracts_dir(cfg: PipelineConfig, source: str) -> Path:
    return root(cfg) / "extracts" / source


def cache_root(cfg: PipelineConfig) -> Path:
    return root(cfg) / "cache"


def cache_dir(cfg: PipelineConfig) -> Path:
    """The event cache of this config's data (a symlink to its current version, cache/versions.py)."""
    return cache_root(cfg) / data_fingerprint(cfg)


def foundation_root(cfg: PipelineConfig) -> Path:
    return root(cfg) / "checkpoints" / "foundation"


def scenario_root(cfg: PipelineConfig, name: str) -> Path:
    return root(cfg) / "checkpoints" / "scenarios" / name


def drift_reference(cfg: PipelineConfig, scenario: str, model_version: str) -> Path:
    """Feature deciles of the population a scenario model version was first scored on (evaluation/drift.py)."""
    return root(cfg) / "predictions" / scenario / ".drift" / f"{model_version}.json"


def latest_foundation_dir(cfg: PipelineConfig) -> Path:
    return latest(foundation_root(cfg), "foundation checkpoint (run `basemodel pretrain CONFIG`)")


def has_scenario(cfg: PipelineConfig, name: str) -> bool:
    return (scenario_root(cfg, name) / "LATEST").exists()


def latest_scenario_dir(cfg: PipelineConfig, name: str) -> Path:
    return latest(scenario_root(cfg, name), f"checkpoint of scenario '{name}' (run `basemodel finetune`)")


PROVENANCE = "provenance.json"


def write_provenance(directory: Path, **versions: str | None) -> None:
    """Record in an output's (staging) directory which checkpoint versions made it, e.g.
    ``scenario="churn", model_version=..., foundation_version=...``; None values are left out."""
    record = {k: v for k, v in versions.items() if v is not None}
    (directory / PROVENANCE).write_text(json.dumps(record, sort_keys=True) + "\n")


def read_provenance(directory: Path) -> dict[str, str] | None:
    """The provenance record of an output directory, or None when it has none (or it is unreadable)."""
    try:
        record = json.loads((directory / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in record.items()} if isinstance(record, dict) else None
