"""SIGTERM and SIGINT stop every stage cleanly: one `stopped:` line, exit code 128 + the signal, no staging left,
and pretraining and fine-tuning resume when run again.

Every test runs the REAL command (`basemodel ...` or a Pipes entrypoint) in a subprocess. To signal a stage while
it is demonstrably inside its work, a small wrapper makes one library call of the stage block (after the
stage's staging exists) and touches a file; the test waits for that file, checks that staging is there, sends
the signal and then checks what is left. One test signals pretraining in its own training loop, with no pause.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from basemodel_pipeline import files as fs
from basemodel_pipeline.config import PipelineConfig, load_config
from basemodel_pipeline.pipeline import run_cache, run_extract
from basemodel_pipeline_tests.conftest import patient

ROOT = Path(__file__).resolve().parents[1]

# argv: FACE ARGS...; FACE is `cli` (the basemodel command) or a module run as __main__ (an entrypoint).
# STOPS_PAUSE is module:function or module:Class.method (unset: no pause); in this process and in the worker
# processes it spawns (they import this script again, as __mp_main__), the STOPS_NTH call whose arguments' text
# contains STOPS_MATCH touches STOPS_SIGNALS/paused and blocks until a signal ends it.
WRAPPER = r"""
import importlib, os, runpy, sys, time
from pathlib import Path

pause = os.environ.get("STOPS_PAUSE")
if pause:
    module_name, attr = pause.rsplit(":", 1)
    owner, _, name = attr.rpartition(".")
    target = importlib.import_module(module_name)
    target = getattr(target, owner) if owner else target
    original = getattr(target, name)
    match, nth, calls = os.environ["STOPS_MATCH"], int(os.environ["STOPS_NTH"]), []

    def paused(*args, **kwargs):
        if match in repr((args, kwargs)):
            calls.append(1)
            if len(calls) == nth:
                (Path(os.environ["STOPS_SIGNALS"]) / "paused").touch()
                while True:
                    time.sleep(0.05)
        return original(*args, **kwargs)

    setattr(target, name, paused)
if __name__ == "__main__":
    face, rest = sys.argv[1], sys.argv[2:]
    if face == "cli":
        from basemodel_pipeline.cli import main

        sys.argv = ["basemodel", *rest]
        main()
    else:
        sys.argv = [face, *rest]
        runpy.run_module(face, run_name="__main__", alter_sys=True)
"""

ENTRY = "basemodel_pipeline.entrypoints."


def _command(tmp: Path, face: str, args: tuple[str, ...]) -> list[str]:
    script = tmp / "stage_wrapper.py"
    script.write_text(WRAPPER)
    return [sys.executable, str(script), face, *args]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_PIPES", "STOPS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env["COLUMNS"] = "200"
    return {**env, **extra}


def start(
    tmp: Path, face: str, *args: str, pause: str = "", match: str = "", nth: int = 1
) -> subprocess.Popen:
    env = _env(STOPS_PAUSE=pause, STOPS_MATCH=match, STOPS_NTH=str(nth), STOPS_SIGNALS=str(tmp))
    cmd = _command(tmp, face, args)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def run(tmp: Path, face: str, *args: str) -> subprocess.CompletedProcess:
    cmd = _command(tmp, face, args)
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=patient(300))


def wait_paused(proc: subprocess.Popen, tmp: Path) -> None:
    deadline = time.monotonic() + patient(150)
    while not (tmp / "paused").exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the stage ended (code {proc.returncode}) before its pause:\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the stage to reach its pause")
        time.sleep(0.05)


def stop(proc: subprocess.Popen, signum: signal.Signals = signal.SIGTERM) -> tuple[int, str, str]:
    """Send `signum` and wait (generously) for the process to end: its exit code, stdout and stderr."""
    import psutil

    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=patient(30))
    except subprocess.TimeoutExpired:
        for process in [*children, proc]:  # its children hold its pipes open too
            with contextlib.suppress(psutil.Error, OSError):
                process.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running long after {signum.name}:\n{out}\n{err}") from None
    return proc.returncode, out, err


PUBLISH = "basemodel_pipeline.files:publish_dir"  # the staging is complete, about to be renamed into place


def stopped_while_publishing(tmp: Path, command: list[str], match: str, under: Path, nth: int = 1) -> str:
    """Run `command` until its `nth` publish of a path containing `match` (its staging then exists under
    `under`), send SIGTERM, and return its stderr once it ended with code 143."""
    proc = start(tmp, *command, pause=PUBLISH, match=match, nth=nth)
    wait_paused(proc, tmp)
    assert staging(under)
    rc, _, err = stop(proc, signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM, err
    return err


def assert_stopped(rc: int, err: str, stage: str, signum: signal.Signals, again: str) -> None:
    assert rc == 128 + signum, err
    lines = [line for line in err.splitlines() if "stopped:" in line]
    assert lines == [
        f"stopped: {stage} received {signum.name}; its staging is removed; run it again to {again}"
    ]
    assert "Traceback" not in err, err


def staging(*roots: Path) -> list[str]:
    """Staging under `roots`: hidden temporaries (directories and part files), their owner files, spills."""
    found = []
    for root in roots:
        for p in root.rglob("*") if root.exists() else ():
            if p.name.endswith((".tmp", ".tmp.owner")) or p.name == ".spill":
                found.append(str(p.relative_to(root)))
    return sorted(found)


def _configured(config: Path, **sections: dict) -> Path:
    raw = yaml.safe_load(config.read_text())
    for path, values in sections.items():
        node = raw
        for part in path.split("__"):
            node = node.setdefault(part, {})
        node.update(values)
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def _with_a_cache(tiny_config: Path, epochs: int) -> tuple[Path, PipelineConfig]:
    """The tiny config, pretraining `epochs` epochs with a resumable state every 3 steps, and its cache."""
    config = _configured(
        tiny_config,
        training_params__foundation={"epochs": epochs, "batch_size": 16, "checkpoint_every_steps": 3},
    )
    cfg = load_config(config)
    run_extract(cfg)
    run_cache(cfg)
    return config, cfg


def _trained_copy(tiny_trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(tiny_trained.parent, tmp_path / "ws", symlinks=True)
    return tmp_path / "ws" / tiny_trained.name


CACHE_PAUSES = {  # a call made inside the DuckDB work, with the staging version and the spill directory made
    "build": "basemodel_pipeline.cache.build:write_attributes",
    "append": "basemodel_pipeline.cache.append:_write",
}


@pytest.mark.parametrize("kind", list(CACHE_PAUSES))
def test_cache_stopped_by_sigterm_removes_its_staging_and_its_sort_spill(
    kind: str, tiny_config: Path
) -> None:
    """A cache build, or an append of new days, stopped in the middle of its DuckDB work: the staging version
    and the spill directory on another volume (cache.spill_directory) are both gone, and the next run builds
    (or appends) the cache."""
    tmp = tiny_config.parent
    spill = tmp / "spill"
    config = _configured(tiny_config, cache={"spill_directory": str(spill)})
    cfg = load_config(config)
    run_extract(cfg)
    workspace = Path(cfg.workspace)
    if kind == "append":  # a cache without the last three days, which then land
        days = sorted((workspace / "extracts" / "transactions").glob("*.parquet"))[-3:]
        for day in days:
            day.rename(tmp / day.name)
        run_cache(cfg)
        for day in days:
            (tmp / day.name).rename(day)
    proc = start(tmp, "cli", "cache", str(config), pause=CACHE_PAUSES[kind])
    wait_paused(proc, tmp)
    assert staging(workspace / "cache") and any(spill.iterdir())  # inside its work: staging and spill exist

    rc, _, err = stop(proc, signal.SIGTERM)

    assert_stopped(rc, err, "cache", signal.SIGTERM, "redo it")
    assert staging(workspace, spill) == []
    assert list(spill.iterdir()) == []
    again = run(tmp, "cli", "cache", str(config))
    assert again.returncode == 0, again.stderr
    assert staging(workspace, spill) == []
    assert ("appended" in again.stdout) == (kind == "append"), again.stdout


def test_pretrain_stopped_by_sigterm_keeps_its_state_and_resumes(tiny_config: Path) -> None:
    """The Pipes entrypoint is stopped while it writes its second resumable state: that half-written state's
    staging is removed, the first state is kept, and the rerun resumes from it and publishes a checkpoint."""
    tmp = tiny_config.parent
    config, cfg = _with_a_cache(tiny_config, epochs=3)
    foundation = Path(cfg.workspace) / "checkpoints" / "foundation"
    command = [ENTRY + "pretrain", "--config", str(config)]

    err = stopped_while_publishing(tmp, command, "/.resume'", foundation, nth=2)

    assert_stopped(143, err, "pretrain", signal.SIGTERM, "resume")
    assert staging(Path(cfg.workspace)) == []
    assert (foundation / ".resume" / "state.json").is_file()
    again = run(tmp, *command)
    assert again.returncode == 0, again.stderr
    assert "resuming from step 3 " in again.stdout, again.stdout
    assert fs.versions(foundation) and not (foundation / ".resume").exists()


def test_pretrain_interrupted_by_sigint_in_its_training_loop_resumes(tiny_config: Path) -> None:
    """Ctrl-C (SIGINT) while `basemodel pretrain` trains, with no pause: it ends within the deadline, says so
    in one line, and `basemodel pretrain` again resumes from the saved state."""
    tmp = tiny_config.parent
    config, cfg = _with_a_cache(tiny_config, epochs=40)
    state = Path(cfg.workspace) / "checkpoints" / "foundation" / ".resume" / "state.json"
    proc = start(tmp, "cli", "pretrain", str(config))
    deadline = time.monotonic() + patient(150)
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()

    rc, _, err = stop(proc, signal.SIGINT)

    assert_stopped(rc, err, "pretrain", signal.SIGINT, "resume")
    assert staging(Path(cfg.workspace)) == []
    assert state.is_file()
    again = run(tmp, "cli", "pretrain", str(config))
    assert again.returncode == 0, again.stderr
    assert "resuming from step" in again.stderr + again.stdout


def test_finetune_stopped_by_sigterm_keeps_its_state_and_resumes(tiny_trained: Path, tmp_path: Path) -> None:
    """`basemodel finetune` is stopped while it writes its second epoch's state: the rerun resumes after the
    first epoch and publishes a scenario version."""
    config = _configured(
        _trained_copy(tiny_trained, tmp_path),
        training_params__finetune={"epochs": 3, "patience": 5, "checkpoint_every_epochs": 1},
    )
    cfg = load_config(config)
    root = Path(cfg.workspace) / "checkpoints" / "scenarios" / "churn"
    before = fs.versions(root)
    command = ["cli", "finetune", str(config), "--scenario", "churn"]

    err = stopped_while_publishing(tmp_path, command, "/.resume/train'", root, nth=2)

    assert_stopped(143, err, "finetune churn", signal.SIGTERM, "resume")
    assert staging(Path(cfg.workspace)) == []
    assert fs.versions(root) == before
    again = run(tmp_path, *command)
    assert again.returncode == 0, again.stderr
    assert "resuming the network's training after epoch 1" in again.stderr + again.stdout
    assert len(fs.versions(root)) == len(before) + 1


SCORING = {  # stage title: (face, its arguments after the config, the output directory, the published file)
    "predict churn": (
        ["cli", "predict", "{config}", "--scenario", "churn"],
        "predictions/churn",
        "predictions",
    ),
    "embed": ([ENTRY + "embed", "--config", "{config}"], "embeddings", "embeddings"),
}


@pytest.mark.parametrize("stage", list(SCORING))
def test_scoring_stopped_with_its_output_staged_publishes_nothing_and_leaves_no_staging(
    stage: str, tiny_trained: Path, tmp_path: Path
) -> None:
    """`basemodel predict` and the embed Pipes entrypoint, stopped with their output fully staged: nothing is
    published, the staging is gone, and the rerun publishes it."""
    config = _trained_copy(tiny_trained, tmp_path)
    cfg = load_config(config)
    face, output, name = SCORING[stage]
    command = [arg.format(config=config) for arg in face]
    out_dir = Path(cfg.workspace) / output

    err = stopped_while_publishing(tmp_path, command, f"/{name}/", out_dir)

    assert_stopped(143, err, stage, signal.SIGTERM, "redo it")
    assert staging(Path(cfg.workspace)) == []
    assert not list(out_dir.glob(f"*/{name}.parquet"))
    again = run(tmp_path, *command)
    assert again.returncode == 0, again.stderr
    assert len(list(out_dir.glob(f"*/{name}.parquet"))) == 1


def test_predict_with_workers_stopped_by_sigterm_ends_its_workers_and_their_part_files(
    tiny_trained: Path, tmp_path: Path
) -> None:
    """`basemodel predict --workers 2` while its workers hold their part files written but not yet renamed:
    SIGTERM to the command alone (what `docker stop` and Dagster's terminate send) ends its workers too, well
    before their shards would finish, and no part file or staging is left."""
    import psutil

    config = _trained_copy(tiny_trained, tmp_path)
    workspace = Path(load_config(config).workspace)
    command = ["cli", "predict", str(config), "--scenario", "churn", "--workers", "2"]
    proc = start(tmp_path, *command, pause="basemodel_pipeline.inference.shards:PartWriter.close")
    wait_paused(proc, tmp_path)
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert workers and staging(workspace / "predictions")

    rc, _, err = stop(proc, signal.SIGTERM)

    assert_stopped(rc, err, "predict churn", signal.SIGTERM, "redo it")
    gone, alive = psutil.wait_procs(workers, timeout=patient(15))
    assert not alive, [p.pid for p in alive]
    assert staging(workspace) == []
    again = run(tmp_path, *command)
    assert again.returncode == 0, again.stderr


# A Dagster run of one asset that launches COMMAND through Pipes as the project's subprocess launcher does
# (PipesSubprocessClient, forward_termination: Dagster's terminate interrupts the run and passes SIGINT on).
ORCHESTRATOR = r"""
import sys
import dagster as dg


@dg.asset
def step(context: dg.AssetExecutionContext):
    client = dg.PipesSubprocessClient(forward_termination=True, termination_timeout_seconds=120)
    return client.run(context=context, command=sys.argv[1:]).get_materialize_result()


print("run succeeded" if dg.materialize([step], raise_on_error=False).success else "run failed", flush=True)
"""


def test_a_pipes_step_stops_cleanly_when_dagster_interrupts_its_run(
    tiny_trained: Path, tmp_path: Path
) -> None:
    """Dagster interrupted while its Pipes step (the embed entrypoint) has its output staged: Dagster passes
    SIGINT on, the step logs its `stopped:` line to Dagster, ends, and leaves no staging; the run fails."""
    config = _trained_copy(tiny_trained, tmp_path)
    workspace = Path(load_config(config).workspace)
    (tmp_path / "orchestrator.py").write_text(ORCHESTRATOR)
    step = _command(tmp_path, ENTRY + "embed", ("--config", str(config)))
    env = _env(STOPS_PAUSE=PUBLISH, STOPS_MATCH="/embeddings/", STOPS_NTH="1", STOPS_SIGNALS=str(tmp_path))
    cmd = [sys.executable, str(tmp_path / "orchestrator.py"), *step]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    wait_paused(proc, tmp_path)
    assert staging(workspace / "embeddings")

    rc, out, err = stop(proc, signal.SIGINT)  # what a terminate does to the run's process

    line = "stopped: embed received SIGINT; its staging is removed; run it again to redo it"
    assert rc == 0 and "run failed" in out, err
    assert "[pipes] execution interrupted, sending SIGINT to subprocess" in err
    assert [x for x in err.splitlines() if "dagster - ERROR" in x and x.endswith(line)], err
    assert staging(workspace) == []
    assert not list((workspace / "embeddings").glob("*/embeddings.parquet"))


def test_embed_disk_full_preflight_removes_its_staging(
    tiny_trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The free-space preflight of the embeddings fails (the volume reports no free space): one DiskFull
    error, and the output's staging directory, made before the preflight, is removed."""
    from basemodel_pipeline import diskfaults
    from basemodel_pipeline.pipeline import run_embed

    config = _trained_copy(tiny_trained, tmp_path)
    cfg = load_config(config)
    embeddings = Path(cfg.workspace) / "embeddings"
    real = shutil.disk_usage

    def full_for_embeddings(path: str | Path):  # the volume the embeddings go to is full
        usage = real(path)
        return usage._replace(free=0) if str(embeddings) in str(path) else usage

    monkeypatch.setattr(diskfaults.shutil, "disk_usage", full_for_embeddings)
    with pytest.raises(diskfaults.DiskFull, match="no space left on"):
        run_embed(cfg)
    assert staging(Path(cfg.workspace)) == []


def test_extract_stopped_by_sigterm_removes_its_staging_and_the_rerun_completes(tiny_config: Path) -> None:
    """An extract stopped while it sorts its second day into place: its day-partition staging and DuckDB spill
    are removed, the day files already renamed into place stay whole, and the rerun extracts every day."""
    tmp = tiny_config.parent
    cfg = load_config(tiny_config)
    out = Path(cfg.workspace) / "extracts" / "transactions"
    proc = start(
        tmp, "cli", "extract", str(tiny_config), "--source", "transactions",
        pause="basemodel_pipeline.sources.extract:write_sorted", match=".parquet", nth=2,
    )  # fmt: skip
    wait_paused(proc, tmp)
    assert staging(out)  # inside its work: the staging and spill exist
    rc, _, err = stop(proc, signal.SIGTERM)

    assert_stopped(rc, err, "extract", signal.SIGTERM, "redo it")
    assert staging(out) == []
    again = run(tmp, "cli", "extract", str(tiny_config))
    assert again.returncode == 0, again.stderr
    assert staging(out) == []
    full = sorted(p.name for p in out.glob("*.parquet"))
    assert len(full) > 2
