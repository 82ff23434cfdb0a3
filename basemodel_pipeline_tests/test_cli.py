"""CLI user errors: one red line on stderr, exit code 2, no traceback; validate passes on the tiny config."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from basemodel_pipeline.cli import app

runner = CliRunner()


def _assert_user_error(args: list[str], *needles: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    for command in (["validate"], ["extract"], ["cache"], ["pretrain"], ["finetune", "-s", "churn"]):
        _assert_user_error([*command, str(missing)], "nope.yaml", "not found")


def test_bad_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("data_sources: [\n  - name: x\n")
    _assert_user_error(["validate", str(bad)], "bad.yaml", "not valid YAML")


def test_invalid_field_names_the_yaml_path(tiny_config: Path) -> None:
    text = tiny_config.read_text().replace("split_interval_days: 7", "split_interval_dayz: 7")
    tiny_config.write_text(text)
    _assert_user_error(["validate", str(tiny_config)], "split_interval_dayz")


@pytest.mark.parametrize("command", ["finetune", "predict"])
def test_unknown_scenario(tiny_config: Path, command: str) -> None:
    _assert_user_error([command, str(tiny_config), "--scenario", "no_such"], "no_such", "churn")


def test_bad_as_of_date(tiny_config: Path) -> None:
    _assert_user_error(["predict", str(tiny_config), "-s", "churn", "--as-of", "2023-02-30"], "--as-of")


def test_validate_ok(tiny_dataset: Path) -> None:
    result = runner.invoke(app, ["validate", str(tiny_dataset)])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output and "churn" in result.output and "transactions" in result.output


def test_finetune_needs_a_scenario(tiny_config: Path) -> None:
    _assert_user_error(["finetune", str(tiny_config)], "--scenario", "--all")


def test_help_lists_the_commands_in_pipeline_order() -> None:
    """The commands register on the one `app` from several modules (cli/stages, scoring, workspace): `--help`
    lists them in the pipeline's order, whatever module defines them."""
    import typer.main

    assert list(typer.main.get_command(app).commands) == [  # type: ignore[attr-defined]
        "validate", "extract", "suggest-config", "data-report", "cache-info", "cache", "pretrain", "finetune",
        "promote", "predict", "embed", "explain", "prune", "verify", "sync-partitions", "demo",
    ]  # fmt: skip
