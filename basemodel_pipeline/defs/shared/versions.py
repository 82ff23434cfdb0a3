"""Code versions of the assets: a hash of the library code each one runs.

Dagster marks an asset stale when its code version differs from the one its latest materialization
recorded, and the automation (`automation.changed_inputs`) reruns it. Each asset hashes only the packages
whose code decides its content, so a change to the CLI or to the Dagster layer retrains nothing, while a
change to the training loop retrains the models that use it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import basemodel_pipeline

PACKAGE = Path(basemodel_pipeline.__file__).parent

# What each asset's content depends on (packages or modules of basemodel_pipeline). The config, the
# workspace layout and the file primitives that write every artifact and its manifest sit under everything.
_GROUND = ("config", "errors.py", "workspace.py", "files.py", "manifests.py", "dates.py", "pipeline.py")
_NET = (*_GROUND, "runtime.py")  # the stages that run the network: device, mixed precision, forward passes
_LATER = (*_NET, "sources", "cache", "features", "model")  # what every stage after the cache reads
# a scenario's fine-tuning, its candidate models, its labels and its task type's class
_SCENARIOS = ("scenarios", "candidates", "targets", "tasks")
# Checked against the import closure of each stage's entry module (test_code_versions.py).
DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "extract": (*_GROUND, "sources"),
    "event_cache": (*_GROUND, "sources", "cache"),
    "foundation_model": (
        *(*_NET, "sources", "cache", "features", "model", "training"),
        *("evaluation/gates.py", "evaluation/metrics.py"),  # its quality gates (training/promotion.py)
    ),
    "scenario_baselines": (*_LATER, "training", "evaluation", *_SCENARIOS),
    "scenario_model": (*_LATER, "outputs", "training", "evaluation", *_SCENARIOS, "inference", "reports"),
    "predictions": (*_LATER, "outputs", "evaluation", *_SCENARIOS, "inference"),
    "entity_embeddings": (*_LATER, "outputs", "evaluation", *_SCENARIOS, "inference"),
    "metrics_summary": (*_GROUND, "reports"),
    "uploaded_artifacts": (*_GROUND, "ops/upload.py"),
    "workspace_retention": (*_GROUND, "ops/retention.py"),
}


@functools.cache
def code_version(asset: str) -> str:
    """Hash (16 hex) of the source files of the packages `asset` depends on; comments count as code."""
    digest = hashlib.sha256()
    for part in DEPENDS_ON[asset]:
        path = PACKAGE / part
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.is_file() else []
        for file in files:
            digest.update(file.relative_to(PACKAGE).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]
