"""What a scenario's fine-tuning run returns (and Dagster shows as metadata): where the checkpoint is and its
headline figures, and, for benchmarks, every candidate's test outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from basemodel_pipeline.candidates.selection import Selection
from basemodel_pipeline.targets.labels import Examples


def kept_outputs(outputs: dict[str, Any], truth: Any, test: Examples) -> dict[str, Any]:
    """What ``keep_outputs`` adds to a result: every candidate's test outputs, and the test rows' labels,
    entities and split times."""
    return {"test_outputs": outputs, "test_truth": truth, "test_entity": test.entity, "test_time": test.time}


def run_summary(
    final: Path,
    version: str,
    result: dict[str, Any],
    selection: Selection,
    timing: dict,
    work: dict,
    baselines_reused: bool,
) -> dict[str, Any]:
    """What a fine-tuning run returns (and Dagster shows): where the checkpoint is and its headline figures."""
    return {
        "path": str(final),
        "version": version,
        "report_path": str(final / "report.html") if (final / "report.html").exists() else None,
        "metric": result["metric"],
        "mode": result["mode"],
        "published": selection.published,
        **{f"test_{k}": v for k, v in result["test"].items() if v is not None},
        **{f"val_{k}": v for k, v in selection.validation.items()},
        "best_val": result["best_val"],
        "epochs": len(result["history"]),
        "train_examples": result["examples"]["train"],
        "classes": result["classes"],
        **{k: round(v, 2) for k, v in timing.items()},
        **work,
        **{f"windows.{k}": v for k, v in result["windows"].items()},
        "foundation_version": result["foundation_version"],
        "cache_data_version": result["cache_data_version"],
        "baselines_reused": baselines_reused,
        "fit_windows": result["fit_windows"],  # what the evaluated and the published model learned from
        "test_worse_than": ",".join(result["test_worse_than"]),  # baselines better on the test window
    }
