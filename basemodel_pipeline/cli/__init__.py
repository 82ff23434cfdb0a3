"""`basemodel`: the pipeline's stages from a terminal, over the same library functions Dagster runs.

    basemodel validate CONFIG                check the YAML and that it fits the data
    basemodel suggest-config CONFIG          profile the sources, write suggested_config.yaml
    basemodel data-report CONFIG             data volume per event source vs the guidelines
    basemodel cache-info CONFIG              cache sizing and the recommended working volume
    basemodel extract|cache|pretrain CONFIG  run one stage
    basemodel extract CONFIG --from D1 --to D2   re-extract event days [D1, D2) only
    basemodel finetune CONFIG --scenario NAME
    basemodel promote CONFIG [--scenario NAME] [--version V] [--force] [--list]   serve a version, roll back
    basemodel predict CONFIG --scenario NAME [--as-of YYYY-MM-DD]
    basemodel embed CONFIG [--as-of YYYY-MM-DD]   float16 foundation embeddings per entity
    basemodel explain CONFIG --scenario NAME [--entity ID] [--population N] [--class LABEL]
    basemodel demo [--workspace demo_workspace]   The Complete Journey end to end through Dagster
    basemodel prune --config CONFIG [--dry-run]  delete old checkpoints/predictions/embeddings (retention)
    basemodel verify CONFIG                  check every artifact against its recorded checksums

A mistake the user can fix prints one red line `error: ...` on stderr and exits with code 2.

The package: common.py holds the one Typer `app`, the consoles, exit codes, option types and shared helpers;
the commands register on that `app` from stages.py (validate, extract, suggest-config, data-report, cache-info,
cache, pretrain, finetune, promote), scoring.py (predict, embed, explain) and workspace.py (prune, verify, demo), imported
here in that order (the order `basemodel --help` lists them). `python -m basemodel_pipeline.cli` runs __main__.py.
"""

from __future__ import annotations

import sys

from rich.markup import escape

# The commands register on `app` as their modules are imported, and `basemodel --help` lists them in that order.
# isort: off
from basemodel_pipeline.cli import stages  # noqa: F401
from basemodel_pipeline.cli import scoring  # noqa: F401
from basemodel_pipeline.cli import workspace  # noqa: F401

# isort: on
from basemodel_pipeline.cli.common import (
    RUN_FAILED,
    USER_ERROR,
    app,
    err,
    fail,
    flag,
    metadata_table,
    out,
    run_stage,
    user_errors,
)
from basemodel_pipeline.cli.scoring import explanation_table
from basemodel_pipeline.cli.workspace import summary_table
from basemodel_pipeline.errors import UserError

__all__ = [
    "RUN_FAILED",
    "USER_ERROR",
    "app",
    "err",
    "explanation_table",
    "fail",
    "flag",
    "main",
    "metadata_table",
    "out",
    "run_stage",
    "summary_table",
    "user_errors",
]


def main() -> None:
    """Console entry point (`basemodel`)."""
    try:
        app()
    except UserError as exc:  # defensive: every command already maps UserError to exit code 2
        err.print(f"[bold red]error:[/bold red] {escape(' '.join(str(exc).split()))}", soft_wrap=True)
        sys.exit(USER_ERROR)
