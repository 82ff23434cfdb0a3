"""Scoring options are typed once (inference/options.py) and translated once each way: every field survives
options -> argv -> options (the CLI's parser and the Pipes entrypoint's) and the Dagster run config -> options;
every flag of `basemodel predict` / `basemodel embed` is a field and every field a flag, so an option cannot be
forgotten in one layer; a wrong value is one line naming the field (the CLI names its flag)."""

import datetime as dt
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import typer
from typer.testing import CliRunner

from basemodel_pipeline.cli import app
from basemodel_pipeline.defs.predictions.assets import EmbeddingsConfig, ScoringConfig
from basemodel_pipeline.entrypoints import _common
from basemodel_pipeline.errors import ArgumentError, UserError
from basemodel_pipeline.inference.options import EmbedOptions, ScoringOptions, flag

# Every field away from its default (one layout: a shard; a subset needs its ids and one process, so the
# entities are a second sample).
EVERY = {
    "as_of": dt.date(2020, 3, 1),
    "output": "warehouse",
    "precision": "int8",
    "device": "auto",
    "replay": True,
    "top_k": 7,
    "threshold": 0.125,
    "shard": (1, 4),
}
SUBSET = {"entities": Path("/data/ids/vip.txt"), "subset": "vip-2020", "device": "cuda:1"}
WORKERS = {"workers": 3, "precision": "bf16"}
MERGE = {"merge_shards": 4, "output": "csv"}
SAMPLES = [EVERY, SUBSET, WORKERS, MERGE]
FACES_OWN = {"config", "scenario"}  # parameters of the commands that are not scoring options


def samples(model: type[EmbedOptions]) -> list[EmbedOptions]:
    return [model(**{k: v for k, v in s.items() if k in model.model_fields}) for s in SAMPLES]


def test_the_samples_cover_every_field() -> None:
    for model in (ScoringOptions, EmbedOptions):
        changed = {name for options in samples(model) for name in options.to_values()}
        assert changed == set(model.model_fields)


@pytest.mark.parametrize("model", [ScoringOptions, EmbedOptions])
def test_every_field_survives_options_to_argv_to_options(model: type[EmbedOptions]) -> None:
    for options in samples(model):
        assert model.from_argv(options.to_argv()) == options
    assert model().to_argv() == []  # the defaults need no flag


@pytest.mark.parametrize("model", [ScoringOptions, EmbedOptions])
def test_the_pipes_entrypoint_reads_what_the_launcher_writes(model: type[EmbedOptions]) -> None:
    for options in samples(model):
        argv = ["--config", "c.yaml", "--scenario", "churn", *options.to_argv()]
        ns = _common.parse_args("predict", argv, scenario=True, as_of=False, source=False, scoring=model)
        args = _common._entrypoint_args(ns, _common._LocalSession(), needs_scenario=True)
        assert args.scoring == options and args.scenario == "churn"


def _command(name: str) -> Any:
    """The click command Typer builds for `basemodel <name>` (Typer ships its own click)."""
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("command", "model"), [("predict", ScoringOptions), ("embed", EmbedOptions)])
def test_every_cli_flag_is_a_field_and_every_field_a_flag(command: str, model: type[EmbedOptions]) -> None:
    params = {p.name: p for p in _command(command).params if p.name not in FACES_OWN}
    assert set(params) == set(model.model_fields)
    for name, param in params.items():
        assert flag(name) in param.opts  # the flag to_argv writes
        assert param.help == model.describe(name)  # one help text


@pytest.mark.parametrize(("command", "model"), [("predict", ScoringOptions), ("embed", EmbedOptions)])
def test_the_cli_parses_what_to_argv_writes(command: str, model: type[EmbedOptions]) -> None:
    for options in samples(model):
        scenario = ["-s", "churn"] if command == "predict" else []
        ctx = _command(command).make_context(command, ["c.yaml", *scenario, *options.to_argv()])
        assert model.from_values(ctx.params) == options


@pytest.mark.parametrize(
    ("config", "model"), [(ScoringConfig, ScoringOptions), (EmbeddingsConfig, EmbedOptions)]
)
def test_every_field_survives_the_dagster_run_config(config: type, model: type[EmbedOptions]) -> None:
    assert set(config.model_fields) == set(model.model_fields)
    for name, field in config.model_fields.items():
        assert field.description == model.model_fields[name].description
    assert config().to_options() == model()  # the launchpad's defaults are the library's
    for options in samples(model):
        run_config = config(**options.to_values())
        assert run_config.to_options() == options
        assert run_config.to_argv() == options.to_argv()  # what the asset launches


def test_the_dagster_run_config_is_plain_config() -> None:
    """The launchpad validates a run config against the class's schema: every field has a Dagster type."""

    @dg.asset
    def scored(config: ScoringConfig) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"argv": " ".join(config.to_argv())})

    run_config = {"ops": {"scored": {"config": {"shard": "0/2", "as_of": "2020-03-01", "replay": True}}}}
    result = dg.materialize([scored], run_config=run_config)
    [mat] = result.asset_materializations_for_node("scored")
    assert mat.metadata["argv"].value == "--as-of 2020-03-01 --replay --shard 0/2"


def test_a_wrong_run_config_value_fails_the_step_in_one_line() -> None:
    with pytest.raises(dg.Failure) as info:
        ScoringConfig(shard="2/2").to_options()
    assert info.value.description == "run config: shard 2/2: write I/K with 0 <= I < K (e.g. 0/4 ... 3/4)"
    assert info.value.allow_retries is False


@pytest.mark.parametrize(
    ("values", "argument", "detail"),
    [
        ({"precision": "fp16"}, "precision", "input should be 'auto', 'fp32', 'bf16' or 'int8'"),
        ({"as_of": "2020-13-01"}, "as_of", "is not a date; write YYYY-MM-DD"),
        ({"device": "gpu"}, "device", "choose cpu, cuda, cuda:N or auto"),
        ({"top_k": 0}, "top_k", "give k of at least 1"),
        ({"threshold": 1.5}, "threshold", "is a probability: give a number from 0 to 1"),
        ({"workers": 0}, "workers", "give a number of worker processes of at least 1"),
        ({"merge_shards": 0}, "merge_shards", "give the number of part files, at least 1"),
        ({"top_k": "many"}, "top_k", "input should be a valid integer"),
        ({"shard": "half"}, "shard", "is not I/K"),
        ({"shard": "2/2"}, "shard", "write I/K with 0 <= I < K"),
        ({"workers": 2, "shard": "0/2"}, "workers", "cannot be combined with shard"),
        ({"shard": "0/2", "merge_shards": 2}, "shard", "cannot be combined with merge_shards"),
        ({"subset": "vip"}, "subset", "a subset needs the ids to score"),
        ({"entities": "ids.txt", "workers": 2}, "entities", "a subset is scored in one process"),
        ({"entities": "ids.txt", "subset": "a/b"}, "subset", "use up to 100 letters"),
        ({"entities": "my ids.txt"}, "subset", "use up to 100 letters"),
        ({"top_kk": 3}, "top_kk", "is not a scoring option"),
    ],
)
def test_a_wrong_value_is_one_line_naming_the_field(values: dict, argument: str, detail: str) -> None:
    with pytest.raises(ArgumentError) as info:
        ScoringOptions(**values)
    assert info.value.argument == argument and detail in info.value.detail
    assert str(info.value).startswith(argument) and "\n" not in str(info.value)


def test_an_unknown_flag_is_one_line() -> None:
    with pytest.raises(UserError, match="^scoring options: unrecognized arguments: --top-kk 3$"):
        ScoringOptions.from_argv(["--top-kk", "3"])


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["predict", "c.yaml", "-s", "churn", "--shard", "2/2"], "--shard 2/2: write I/K with 0 <= I < K"),
        (
            ["predict", "c.yaml", "-s", "churn", "--workers", "0"],
            "--workers 0: give a number of worker processes",
        ),
        (
            ["predict", "c.yaml", "-s", "churn", "--workers", "-2"],
            "--workers -2: give a number of worker processes",
        ),
        (
            ["predict", "c.yaml", "-s", "churn", "--as-of", "2020-13-01"],
            "--as-of '2020-13-01': is not a date",
        ),
        (
            ["predict", "c.yaml", "-s", "churn", "--workers", "2", "--merge-shards", "2"],
            "--workers: cannot be",
        ),
        (["embed", "c.yaml", "--precision", "fp16"], "--precision 'fp16': input should be 'auto'"),
    ],
)
def test_the_cli_names_the_flag_of_a_wrong_value(argv: list[str], line: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert line in result.output and result.output.count("error:") == 1 and "Traceback" not in result.output


def test_a_worker_gets_its_shard_and_no_output() -> None:
    options = ScoringOptions(workers=4, output="warehouse", precision="fp32", replay=True)
    shard = options.for_shard(2, 4, dt.date(2020, 3, 1))
    assert shard == ScoringOptions(shard=(2, 4), precision="fp32", replay=True, as_of=dt.date(2020, 3, 1))
    assert shard.single is False and ScoringOptions().single
