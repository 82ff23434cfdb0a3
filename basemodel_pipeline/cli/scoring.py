"""Scoring with a trained model: predict, embed and explain (with the explanation's table), registered on the
one `app` of basemodel_pipeline.cli.common."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from basemodel_pipeline import pipeline
from basemodel_pipeline.cli.common import (
    AsOfOpt,
    ConfigArg,
    ScenarioOpt,
    app,
    as_of_date,
    err,
    out,
    run_stage,
    scenario_name,
    user_errors,
)
from basemodel_pipeline.config import load_config
from basemodel_pipeline.inference.options import EmbedOptions, ScoringOptions

Help = ScoringOptions.describe  # each option's help is its field's description (inference/options.py)


@app.command()
def predict(
    config: ConfigArg,
    scenario: ScenarioOpt,
    as_of: AsOfOpt = None,
    entities: Annotated[Path | None, typer.Option("--entities", help=Help("entities"))] = None,
    subset: Annotated[str | None, typer.Option("--subset", help=Help("subset"))] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help=Help("output"))] = None,
    precision: Annotated[str, typer.Option("--precision", help=Help("precision"))] = "auto",
    device: Annotated[str, typer.Option("--device", help=Help("device"))] = "cpu",
    top_k: Annotated[int | None, typer.Option("--top-k", help=Help("top_k"))] = None,
    threshold: Annotated[float | None, typer.Option("--threshold", help=Help("threshold"))] = None,
    shard: Annotated[str | None, typer.Option("--shard", help=Help("shard"))] = None,
    merge_shards: Annotated[int | None, typer.Option("--merge-shards", help=Help("merge_shards"))] = None,
    workers: Annotated[int, typer.Option("--workers", help=Help("workers"))] = 1,
    replay: Annotated[bool, typer.Option("--replay", help=Help("replay"))] = False,
) -> None:
    """Score every entity (or --entities) for one scenario and write the table to the output."""
    with user_errors():  # every parameter but the config and the scenario is a field of the options
        options = ScoringOptions.from_values(locals())
    run_stage(
        f"predict {scenario}",
        config,
        lambda cfg, p: pipeline.run_predict(cfg, scenario_name(cfg, scenario), options, p),
    )


@app.command()
def embed(
    config: ConfigArg,
    as_of: AsOfOpt = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help=Help("output"))] = None,
    precision: Annotated[str, typer.Option("--precision", help=Help("precision"))] = "auto",
    device: Annotated[str, typer.Option("--device", help=Help("device"))] = "cpu",
    replay: Annotated[bool, typer.Option("--replay", help=Help("replay"))] = False,
) -> None:
    """Export float16 foundation embeddings of every entity (Parquet + client_ids.npy/embeddings.npy)."""
    with user_errors():  # every parameter but the config is a field of the options
        options = EmbedOptions.from_values(locals())
    run_stage("embed", config, lambda cfg, p: pipeline.run_embed(cfg, options, p))


@app.command()
def explain(
    config: ConfigArg,
    scenario: ScenarioOpt,
    entity: Annotated[str | None, typer.Option("--entity", help="Explain this entity id.")] = None,
    as_of: AsOfOpt = None,
    population: Annotated[
        int,
        typer.Option("--population", help="Without --entity: mean |attribution| over N sampled entities."),
    ] = 2000,
    label: Annotated[
        str | None,
        typer.Option("--class", help="Multiclass/multilabel: explain this class (default: the top one)."),
    ] = None,
    baseline: Annotated[
        str, typer.Option("--baseline", help="mean (the training mean) | empty (the entity with no events).")
    ] = "mean",
    steps: Annotated[int, typer.Option("--steps", help="Integrated-gradients quadrature steps.", min=2)] = 32,
) -> None:
    """Integrated-gradients attributions of a scenario's output per source, column and value (docs/explain.md)."""
    from basemodel_pipeline.reports.explanations import run_explain

    date = as_of_date(as_of)
    with user_errors():
        cfg = load_config(config)
        start = time.perf_counter()
        result = run_explain(cfg, cfg.scenario(scenario), entity, date, population, label, steps, baseline)
    out.print(explanation_table(result, time.perf_counter() - start))
    if "warning" in result:  # the workspace could not take the files
        err.print(f"warning: {escape(result['warning'])}", soft_wrap=True, highlight=False)


def explanation_table(result: Mapping[str, Any], seconds: float, top: int = 15) -> Table:
    """The top sources, columns and values of an explanation, and where the JSON and plot went."""
    single = "entity_id" in result
    key = "attribution" if single else "mean_abs_attribution"
    who = f"entity {result['entity_id']}" if single else f"{result['entities']} entities (mean |attribution|)"
    value = result["output"]["value" if single else "mean_value"]
    table = Table(
        title=f"explain {result['scenario']} as of {result['as_of']}: {who} ({seconds:.1f} s)",
        caption=f"{result['output']['description']}: {value:.4g}; baseline {result['baseline']['kind']} "
        f"{result['baseline']['output']:.4g}; JSON {result['json_path']}; plot {result['plot_path']}",
        title_justify="left",
        caption_justify="left",
    )
    for col in ("level", "source", "column", "value", key):
        table.add_column(col, justify="right" if col == key else "left")
    for level in ("sources", "columns", "values"):
        for row in result[level][:top]:
            table.add_row(
                level[:-1],
                escape(str(row.get("source", ""))),
                escape(str(row.get("column", ""))),
                escape(str(row.get("value", ""))),
                f"{row[key]:+.4f}" if single else f"{row[key]:.4f}",
            )
    return table
