"""Python targets run trusted user code in-process: each import and each call has a time limit
(target.timeout_s), and whatever the module raises reaches the user as one line naming the function (the
cause chained for library callers and logs), never a traceback."""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from basemodel_pipeline.cli import app
from basemodel_pipeline.targets.time_limit import TimeLimit, TimeLimitExceeded

TARGETS = """
import sys
import time


def fine(history, future, attributes, ctx):
    return float(future["transactions"].exists())


def raises(history, future, attributes, ctx):
    return {}["missing"]


def spins(history, future, attributes, ctx):
    while True:
        try:
            pass
        except Exception:  # user code swallowing errors does not swallow the time limit
            pass


def sleeps(history, future, attributes, ctx):
    time.sleep(3600)


def exits(history, future, attributes, ctx):
    sys.exit(3)
"""
RAISING_LINE = TARGETS.splitlines().index('    return {}["missing"]') + 1
RUNAWAY_S = 0.3  # target.timeout_s of the runaway scenarios


def _python_scenario(name: str, function: str, **target: object) -> dict:
    return {
        "name": name,
        "task": "binary",
        "target": {
            "kind": "python",
            "function": function,
            "source": "transactions",
            "horizon_days": 14,
            **target,
        },
    }


@pytest.fixture(scope="module")
def trained(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny workspace with a foundation model and one scenario per way a target can misbehave."""
    from basemodel_pipeline.config import load_config
    from basemodel_pipeline.pipeline import run_cache, run_extract, run_pretrain

    d = tmp_path_factory.mktemp("python_targets")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    (d / "pt_targets.py").write_text(TARGETS)
    raw = yaml.safe_load(tiny_dataset.read_text())
    raw["scenarios"] = [
        _python_scenario("py_raises", "pt_targets:raises"),
        _python_scenario("py_spins", "pt_targets:spins", timeout_s=RUNAWAY_S),
        _python_scenario("py_sleeps", "pt_targets:sleeps", timeout_s=RUNAWAY_S),
        _python_scenario("py_exits", "pt_targets:exits"),
    ]
    config = d / "config.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = load_config(config)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    yield config
    sys.modules.pop("pt_targets", None)


def _one_error_line(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # and progress bars
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "scenario, needles",
    [
        (
            "py_raises",
            [
                "scenario 'py_raises': target function pt_targets:raises raised KeyError: 'missing' for entity",
                f"(raised at pt_targets.py:{RAISING_LINE})",
            ],
        ),
        ("py_exits", ["target function pt_targets:exits raised SystemExit: 3 for entity"]),
        (
            "py_spins",
            [
                "target function pt_targets:spins took longer than",
                f"{RUNAWAY_S:g} s (target.timeout_s)",
                "for entity",
            ],
        ),
        ("py_sleeps", ["target function pt_targets:sleeps took longer than", "target.timeout_s"]),
    ],
)
def test_a_misbehaving_target_function_is_one_line_from_finetune(
    trained: Path, scenario: str, needles: list[str]
) -> None:
    """Before: a function looping for ever hung `finetune` (no time limit); sys.exit ended the pipeline."""
    line = _one_error_line(["finetune", str(trained), "-s", scenario])
    for needle in needles:
        assert needle in line, (needle, line)


@pytest.mark.parametrize(
    "module, needles",
    [
        (
            "x = 1\ny = 1 / 0\n",
            ["importing module 'pt_broken_{n}' raised ZeroDivisionError", "pt_broken_{n}.py:2"],
        ),
        ("def f(:\n", ["importing module 'pt_broken_{n}' raised SyntaxError", "pt_broken_{n}.py:1"]),
        (
            "while True:\n    pass\n",
            ["importing module 'pt_broken_{n}' took longer than", "target.timeout_s"],
        ),
    ],
)
def test_a_target_module_that_fails_to_import_is_one_line_from_validate(
    tiny_config: Path, module: str, needles: list[str]
) -> None:
    """Before: a module raising (or with a syntax error) at import ended `finetune` in a traceback, and one
    that never finished importing hung it. `validate` imports each target module (under the time limit), so
    this shows before any training."""
    n = abs(hash(module)) % 10**6
    (tiny_config.parent / f"pt_broken_{n}.py").write_text(module)
    raw = yaml.safe_load(tiny_config.read_text())
    raw["scenarios"] = [_python_scenario("py_broken", f"pt_broken_{n}:f", timeout_s=RUNAWAY_S)]
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    line = _one_error_line(["validate", str(tiny_config)])
    assert "scenario 'py_broken': target.function" in line
    for needle in needles:
        assert needle.format(n=n) in line, (needle, line)


def test_timeout_s_is_a_positive_number_of_seconds_with_a_default(tiny_config: Path) -> None:
    from basemodel_pipeline.config import load_config
    from basemodel_pipeline.config.scenarios import TARGET_TIMEOUT_S

    raw = yaml.safe_load(tiny_config.read_text())
    raw["scenarios"] = [_python_scenario("py", "m:f")]
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert load_config(tiny_config).scenario("py").target.timeout_s == TARGET_TIMEOUT_S
    raw["scenarios"][0]["target"]["timeout_s"] = 0
    tiny_config.write_text(yaml.safe_dump(raw, sort_keys=False))
    _one_error_line(["validate", str(tiny_config)])


# --- the time limit itself ---------------------------------------------------------------------------


def _spin() -> None:
    while True:
        with contextlib.suppress(Exception):  # swallows errors, not the time limit
            pass


def test_a_call_past_its_limit_is_stopped_in_the_main_thread_and_the_alarm_handler_is_put_back() -> None:
    before = signal.getsignal(signal.SIGALRM)
    with TimeLimit(0.1) as limit:
        assert limit.call(lambda x: x + 1, 1) == 2
        with pytest.raises(TimeLimitExceeded):
            limit.call(_spin)
        with pytest.raises(TimeLimitExceeded):
            limit.call(time.sleep, 3600)
        assert limit.call(lambda: "after") == "after"  # the limit holds per call
    assert signal.getsignal(signal.SIGALRM) is before


def test_a_call_past_its_limit_is_stopped_in_another_thread() -> None:
    outcome: list[object] = []

    def worker() -> None:
        with TimeLimit(0.1) as limit:
            outcome.append(limit.call(lambda: "fast"))
            try:
                limit.call(_spin)
            except TimeLimitExceeded:
                outcome.append("stopped")
            outcome.append(limit.call(lambda: "after"))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(60)
    assert outcome == ["fast", "stopped", "after"]
