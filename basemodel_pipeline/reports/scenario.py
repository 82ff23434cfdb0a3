"""A fine-tuned scenario's report files: report.html with its "what drives the model" section, and
explanation.json. pipeline.py hands report_files to scenarios.finetune.finetune_many, which publishes them
with the checkpoint; the scenarios layer itself never imports reports/."""

from __future__ import annotations

from basemodel_pipeline.reports.explanations import add_report_explanation
from basemodel_pipeline.reports.html import scenario_report
from basemodel_pipeline.scenarios.finetune import Finished


def report_files(done: Finished) -> dict[str, str]:
    """{"report.html": ..., "explanation.json": ...} (no explanation for tasks it does not cover)."""
    files = {"report.html": scenario_report(done.scenario, done.result, done.truth, done.outputs)}
    # the network's view of what drives the model, on a sample of the test examples
    add_report_explanation(files, done.shared, done.model, done.task, done.test)
    return files
