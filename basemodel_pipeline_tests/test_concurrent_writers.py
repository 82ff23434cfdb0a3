"""Concurrent writers of one workspace: nothing lost, nothing silently wrong.

Every test runs REAL processes (subprocesses running the library) and forces the dangerous interleaving with
signal files: a child pauses at a chosen point until the test lets it go, so nothing depends on timing luck.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from basemodel_pipeline.config import load_config
from basemodel_pipeline.pipeline import run_extract

DAY = dt.timedelta(days=1)
WAIT_S = 300  # a generous bound for a child to reach a signal; never hit when the code is right
ROOT = Path(__file__).resolve().parents[1]

# A child: pause on the first call of `module.attr` (after touching <signals>/<who>.paused, until
# <signals>/<who>.go exists), report every progress.log line containing "waiting" by touching
# <signals>/<who>.waiting, then run the pipeline function named on the command line.
CHILD = r"""
import datetime as dt, importlib, json, sys, time
from pathlib import Path

config, signals, who, pause, stage, args = sys.argv[1:7]
signals = Path(signals)
args = json.loads(args)


def touch(name):
    (signals / f"{who}.{name}").touch()


if pause != "-":
    module_name, attr = pause.rsplit(":", 1)
    owner, _, name = attr.rpartition(".")
    target = importlib.import_module(module_name)
    if owner:
        target = getattr(target, owner)
    original = getattr(target, name)
    calls = []

    def paused(*a, **kw):
        if not calls:
            calls.append(1)
            touch("paused")
            while not (signals / f"{who}.go").exists():
                time.sleep(0.05)
        return original(*a, **kw)

    setattr(target, name, paused)


class Progress:
    def start(self, task, total): pass
    def advance(self, task, amount=1, **metrics): pass
    def log(self, message):
        print(message, flush=True)
        if "waiting" in message:
            touch("waiting")


from basemodel_pipeline import pipeline
from basemodel_pipeline.config import load_config

cfg = load_config(config)
if stage == "extract":
    days = tuple(dt.date.fromisoformat(d) for d in args["days"]) if args.get("days") else None
    result = pipeline.run_extract(cfg, args["source"], progress=Progress(), days=days)
else:
    from basemodel_pipeline.inference.options import ScoringOptions

    scenario = args.pop("scenario")
    result = pipeline.run_predict(cfg, scenario, ScoringOptions.from_values(args), progress=Progress())
print(json.dumps(result, default=str))
"""


def child(tmp: Path, config: Path, who: str, pause: str, stage: str, args: str) -> subprocess.Popen:
    """Start a child process (see CHILD) running `stage` with JSON `args`."""
    script = tmp / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(script), str(config), str(tmp), who, pause, stage, args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll until `condition()` holds (the interleaving is forced by signals, not by this timeout)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=WAIT_S)
    return proc.returncode, out


def source_rows_per_day(cfg) -> dict[str, int]:
    """Rows per day of the transactions source that the extract keeps (its where_condition: quantity > 0)."""
    table = pq.read_table(cfg.source("transactions").data_location.path)
    assert cfg.source("transactions").where_condition == "quantity > 0"
    table = table.filter(pc.greater(table["quantity"], 0))
    days = pc.strftime(table["transaction_timestamp"], format="%Y-%m-%d")
    counts = pc.value_counts(days)
    return {f"{v['values']}.parquet": v["counts"] for v in counts.to_pylist()}


def extract_rows_per_day(cfg) -> dict[str, int]:
    d = Path(cfg.workspace) / "extracts" / "transactions"
    return {p.name: pq.read_metadata(p).num_rows for p in sorted(d.glob("*.parquet"))}


def test_a_full_extract_and_a_day_range_at_once_lose_nothing(tiny_config: Path) -> None:
    """Process A (the whole source) pauses after staging its day partitions; process B (a day range) starts
    meanwhile. B must not clean A's staging away: it waits for A's lock (and says so), and afterwards every
    day file holds exactly the source's rows of that day, whatever the two reported."""
    cfg = load_config(tiny_config)
    tmp = tiny_config.parent
    start = cfg.data_params.data_start_date + 10 * DAY
    full = '{"source": "transactions"}'
    part = f'{{"source": "transactions", "days": ["{start}", "{start + 5 * DAY}"]}}'
    a = child(tmp, tiny_config, "A", "basemodel_pipeline.sources.extract:write_sorted", "extract", full)
    wait_for(lambda: (tmp / "A.paused").exists() or a.poll() is not None, "A to stage its days")
    assert a.poll() is None, finish(a)[1]
    b = child(tmp, tiny_config, "B", "-", "extract", part)
    wait_for(lambda: (tmp / "B.waiting").exists() or b.poll() is not None, "B to wait for A or finish")
    (tmp / "A.go").touch()
    (rc_a, out_a), (rc_b, out_b) = finish(a), finish(b)

    assert rc_a == 0, out_a
    assert rc_b == 0, out_b
    assert "another extract of source transactions is running (pid " in out_b
    assert extract_rows_per_day(cfg) == source_rows_per_day(cfg)
    assert not [p.name for p in (Path(cfg.workspace) / "extracts" / "transactions").glob(".*.tmp")]


def test_a_second_extract_waits_then_gives_up_with_one_line(tiny_config: Path) -> None:
    """With a lock timeout a waiting extract fails with a one-line UserError naming the holder's pid."""
    from basemodel_pipeline.errors import UserError
    from basemodel_pipeline.progress import NullProgress
    from basemodel_pipeline.sources import extract

    cfg = load_config(tiny_config)
    tmp = tiny_config.parent
    a = child(tmp, tiny_config, "A", "basemodel_pipeline.sources.extract:write_sorted", "extract",
              '{"source": "transactions"}')  # fmt: skip
    try:
        wait_for(lambda: (tmp / "A.paused").exists() or a.poll() is not None, "A to stage its days")
        with pytest.raises(
            UserError, match=rf"another extract of source transactions is running \(pid {a.pid}\)"
        ):
            extract.extract_source(cfg, cfg.source("transactions"), NullProgress(), lock_timeout_s=0.2)
    finally:
        (tmp / "A.go").touch()
        rc, out = finish(a)
    assert rc == 0, out
    assert extract_rows_per_day(cfg) == source_rows_per_day(cfg)


HOLDER = r"""
import sys, time
from pathlib import Path
from basemodel_pipeline import files as fs
from basemodel_pipeline import locks
from basemodel_pipeline import workspace as ws

final, signal_file = Path(sys.argv[1]), Path(sys.argv[2])
tmp = fs.staging_dir(final)
(tmp / "part.bin").write_bytes(b"x")
signal_file.write_text(str(tmp))
time.sleep(600)
"""


def test_cleanup_removes_only_staging_of_dead_writers(tmp_path: Path) -> None:
    """clean_stale_tmp leaves a live process's staging directory alone and removes it once that process is
    killed (SIGKILL: no cleanup of its own); a staging directory of this process survives too."""
    from basemodel_pipeline import files as fs

    parent = tmp_path / "outputs"
    signal_file = tmp_path / "staged"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(parent / "2024-03-01"), str(signal_file)], env=env
    )
    try:
        wait_for(lambda: signal_file.exists() and signal_file.read_text(), "the holder to stage")
        theirs = Path(signal_file.read_text())
        mine = fs.staging_dir(parent / "2024-03-02")
        fs.clean_stale_tmp(parent)
        assert (theirs / "part.bin").exists() and mine.is_dir()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    fs.clean_stale_tmp(parent)
    assert not theirs.exists() and mine.is_dir()
    assert sorted(p.name for p in parent.iterdir()) == sorted(
        p.name for p in parent.iterdir() if p.name.startswith(mine.name)
    )
    fs.publish_dir(mine, parent / "2024-03-02")
    assert sorted(p.name for p in parent.iterdir()) == ["2024-03-02"]


@pytest.fixture(scope="module")
def trained(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with extracts, the cache, a foundation and the 'churn' scenario (read-only for tests)."""
    import shutil

    from basemodel_pipeline.pipeline import run_cache, run_finetune, run_pretrain

    d = tmp_path_factory.mktemp("trained")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    config = Path(shutil.copy(tiny_dataset, d / "config.yaml"))
    cfg = load_config(config)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    run_finetune(cfg, "churn")
    return config


def _predictions_root(cfg) -> Path:
    return Path(cfg.workspace) / "predictions" / "churn"


def test_two_predicts_of_one_scenario_at_once_both_publish(trained: Path, tmp_path: Path) -> None:
    """Process A pauses with its staging directory open; process B (another as-of date) runs to the end,
    cleaning stale temporaries on its way. A must still publish its table, and so must B."""
    from basemodel_pipeline.cache.store import EventCache
    from basemodel_pipeline.workspace import cache_dir

    cfg = load_config(trained)
    cache = EventCache(cache_dir(cfg))
    late = cache.max_date + DAY
    early = cache.max_date - 10 * DAY
    args = '{{"scenario": "churn", "as_of": "{}", "precision": "fp32"}}'
    a = child(tmp_path, trained, "A", "basemodel_pipeline.outputs.files:FileWriter._write", "predict",
              args.format(early))  # fmt: skip
    wait_for(lambda: (tmp_path / "A.paused").exists() or a.poll() is not None, "A to open its writer")
    assert a.poll() is None, finish(a)[1]
    b = child(tmp_path, trained, "B", "-", "predict", args.format(late))
    rc_b, out_b = finish(b)
    (tmp_path / "A.go").touch()
    rc_a, out_a = finish(a)

    assert rc_b == 0, out_b
    assert rc_a == 0, out_a
    for as_of in (early, late):
        table = pq.read_table(_predictions_root(cfg) / as_of.isoformat() / "predictions.parquet")
        assert table.num_rows == cache.n_entities
        assert set(pc.unique(table["as_of"]).to_pylist()) == {as_of}
    assert not list(_predictions_root(cfg).glob(".*.tmp"))


def test_a_subset_predict_keeps_the_full_table(trained: Path, tmp_path: Path) -> None:
    """`predict --entities vip.txt` writes predictions/<scenario>/<as_of>/subsets/vip/ and leaves the full
    table as it was; a later full run keeps the subset."""
    from typer.testing import CliRunner

    from basemodel_pipeline.cli import app
    from basemodel_pipeline.inference.options import ScoringOptions
    from basemodel_pipeline.pipeline import run_predict

    cfg = load_config(trained)
    full = run_predict(cfg, "churn", ScoringOptions(precision="fp32"))
    final = Path(full["path"]).parent
    everyone = pq.read_table(full["path"])
    ids = [str(v) for v in everyone["entity_id"].to_pylist()[:3]]
    (tmp_path / "vip.txt").write_text("\n".join(ids) + "\n")

    args = [
        "predict",
        str(trained),
        "-s",
        "churn",
        "--precision",
        "fp32",
        "--entities",
        str(tmp_path / "vip.txt"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert pq.read_table(final / "predictions.parquet").equals(everyone)  # every row survives
    subset = pq.read_table(final / "subsets" / "vip" / "predictions.parquet")
    assert [str(v) for v in subset["entity_id"].to_pylist()] == ids
    full_scores = dict(zip(everyone["entity_id"].to_pylist(), everyone["score"].to_pylist(), strict=True))
    assert all(
        abs(full_scores[e] - s) < 1e-6
        for e, s in zip(*subset.select(["entity_id", "score"]).to_pydict().values(), strict=True)
    )
    assert ws_provenance(final / "subsets" / "vip")["model_version"] == full["model_version"]

    again = run_predict(cfg, "churn", ScoringOptions(precision="fp32"))
    assert Path(again["path"]).parent == final
    assert pq.read_table(final / "subsets" / "vip" / "predictions.parquet").equals(subset)


def ws_provenance(directory: Path) -> dict[str, str]:
    from basemodel_pipeline import workspace as ws

    record = ws.read_provenance(directory)
    assert record is not None, directory
    return record


def test_a_subset_refuses_what_would_replace_the_whole_slice(trained: Path, tmp_path: Path) -> None:
    """Subsets do not mix with shards (their merge replaces the full table) nor with warehouse tables (their
    writers replace the whole (scenario, as_of) slice); each error is one line, given before any scoring."""
    import yaml
    from typer.testing import CliRunner

    from basemodel_pipeline.cli import app
    from basemodel_pipeline.errors import UserError
    from basemodel_pipeline.inference.options import ScoringOptions
    from basemodel_pipeline.pipeline import run_predict

    ids = tmp_path / "ids.txt"
    ids.write_text("1\n")
    with pytest.raises(UserError, match="^entities: a subset is scored in one process") as info:
        ScoringOptions(shard=(0, 2), entities=ids)
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="^subset 'a/b': use up to 100 letters"):
        ScoringOptions(entities=ids, subset="a/b")
    raw = yaml.safe_load(trained.read_text())
    params = {"account": "a", "user": "u", "database": "D", "schema": "S"}
    raw["outputs"] = {"destinations": {"wh": {"kind": "snowflake", "connection_params": params}}}
    other = trained.with_name("warehouse_config.yaml")
    other.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(UserError, match="^output 'wh': is a snowflake table, where a subset would replace"):
        run_predict(load_config(other), "churn", ScoringOptions(entities=ids, output="wh"))
    result = CliRunner().invoke(
        app, ["predict", str(trained), "-s", "churn", "--entities", str(ids), "--workers", "2"]
    )
    assert result.exit_code == 2 and "--entities: a subset is scored in one process" in result.output
    result = CliRunner().invoke(
        app, ["predict", str(trained), "-s", "churn", "--entities", str(ids), "--subset", "a/b"]
    )  # the CLI speaks of its flags where the library names its arguments
    assert result.exit_code == 2 and "--subset 'a/b': use up to 100 letters" in result.output


def test_a_cleaner_between_creating_and_locking_an_owner_file_cannot_orphan_the_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaner that runs after a writer created its owner file but before it locked it takes the file for
    an orphan and removes it; the writer notices and claims another name, so its staging keeps an owner."""
    from basemodel_pipeline import files as fs

    parent = tmp_path / "outputs"
    parent.mkdir()
    real_flock = fs.fcntl.flock
    raced = []

    def flock(fd: int, op: int) -> None:
        if op == fs.fcntl.LOCK_EX and not raced:  # the writer's first lock: a cleaner gets there first
            raced.append(sorted(p.name for p in parent.iterdir()))
            fs.clean_stale_tmp(parent)
        real_flock(fd, op)

    monkeypatch.setattr(fs.fcntl, "flock", flock)
    staging = fs.staging_dir(parent / "2024-03-01")
    monkeypatch.setattr(fs.fcntl, "flock", real_flock)

    assert raced and raced[0][0].endswith(".tmp.owner")  # the race happened: an owner file, no staging yet
    assert (parent / (staging.name + fs.OWNER_SUFFIX)).exists()
    fd = fs._owned.pop(staging)  # seen as another process sees it: ...
    try:
        fs.clean_stale_tmp(parent)  # ... its owner file is locked, so it is kept
        assert staging.is_dir()
    finally:
        fs._owned[staging] = fd
    fs.publish_dir(staging, parent / "2024-03-01")


TRAIN_HOLDER = r"""
import sys, time
from pathlib import Path
from basemodel_pipeline import files as fs
from basemodel_pipeline import locks
from basemodel_pipeline import workspace as ws

root, signal_file = Path(sys.argv[1]), Path(sys.argv[2])
with locks.training_lock(root, sys.argv[3], print):
    signal_file.write_text("held")
    time.sleep(600)
"""


def _hold_training_lock(tmp: Path, root: Path, what: str) -> subprocess.Popen:
    """A process holding a training stage's lock (as a running pretrain or finetune does) until killed."""
    signal_file = tmp / f"held-{root.name}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", TRAIN_HOLDER, str(root), str(signal_file), what], env=env)
    wait_for(lambda: signal_file.exists() or proc.poll() is not None, "the holder to take the lock")
    assert proc.poll() is None
    return proc


@pytest.mark.parametrize(
    ("command", "root", "what"),
    [
        (["pretrain"], "checkpoints/foundation", "pretrain"),
        (["finetune", "-s", "churn"], "checkpoints/scenarios/churn", "finetune of churn"),
    ],
)
def test_a_second_training_run_fails_at_once_naming_the_first(
    tiny_config: Path, command: list[str], root: str, what: str
) -> None:
    """pretrain and each scenario's finetune hold a lock on their checkpoint root: a second run of the same
    stage does not share the first one's resume state; it fails with one line naming the running pid."""
    from typer.testing import CliRunner

    from basemodel_pipeline.cli import app
    from basemodel_pipeline.pipeline import run_cache

    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    holder = _hold_training_lock(tiny_config.parent, Path(cfg.workspace) / root, what)
    try:
        result = CliRunner().invoke(app, [*command, str(tiny_config)])
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"another {what} is running (pid {holder.pid})" in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_a_lock_whose_holder_was_killed_is_taken_over_with_a_line(tmp_path: Path) -> None:
    """flock is released by the kernel when its holder dies; the pid it left in the lock file says that a
    run ended without finishing, and the next holder says it takes over (a clean end leaves no pid)."""
    from basemodel_pipeline import locks

    root = tmp_path / "foundation"
    holder = _hold_training_lock(tmp_path, root, "pretrain")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lines: list[str] = []
    with locks.training_lock(root, "pretrain", lines.append):
        pass
    assert lines == [f"pretrain: taking over the lock of pid {holder.pid}, which ended without releasing it"]
    lines.clear()
    with locks.training_lock(root, "pretrain", lines.append):  # the previous holder ended cleanly
        pass
    assert lines == []
