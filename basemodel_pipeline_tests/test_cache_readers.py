"""Readers and writers of the event cache: a trainer holding the cache open while it is appended to or
rebuilt keeps reading the version it opened; the writer never waits for it; old versions go once unused."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from basemodel_pipeline.cache import versions
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import PipelineConfig, load_config
from basemodel_pipeline.defs.cache.checks import manifest_problems
from basemodel_pipeline.pipeline import run_cache, run_extract
from basemodel_pipeline.workspace import cache_dir

# A reader stage in miniature: open the cache, read every array, wait for the test's signal, read again,
# this time also what EventCache reads lazily (entity ids, vocabularies), then let go of the cache.
READER = r"""
import hashlib, json, sys, time
from pathlib import Path

import numpy as np

from basemodel_pipeline.cache.store import EventCache


def snapshot(cache, lazy):
    h = hashlib.sha256()
    for name in sorted(cache.sources):
        src = cache.sources[name]
        for a in (src.offsets, src.ts, *(src.columns[c] for c in sorted(src.columns))):
            h.update(np.ascontiguousarray(a).tobytes())
    out = {
        "path": str(cache.path),
        "n_entities": cache.n_entities,
        "n_events": {n: s.n_events for n, s in cache.sources.items()},
        "arrays": h.hexdigest(),
    }
    if lazy:
        ids = np.asarray(cache.entity_ids)
        out["entity_ids"] = hashlib.sha256(ids.astype(str).astype("U").tobytes()).hexdigest()
        out["n_ids"] = len(ids)
        out["vocab"] = cache.source("transactions").vocab("product_id")
    return out


path, box = Path(sys.argv[1]), Path(sys.argv[2])
cache = EventCache(path)
# written then renamed: the test polls for the name and must never read a half-written file
(box / "opened.tmp").write_text(json.dumps({**snapshot(cache, lazy=False), "t": time.time()}))
(box / "opened.tmp").rename(box / "opened.json")
while not (box / "go").exists():
    time.sleep(0.01)
after = {**snapshot(cache, lazy=True), "t": time.time()}
del cache  # the stage is done with the cache
(box / "after.json").write_text(json.dumps({**after, "released": time.time()}))
"""


def wait_for(ready: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def start_reader(path: Path, box: Path) -> subprocess.Popen:
    """A reader process holding the cache at `path` open until `box/go` appears."""
    box.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", READER, str(path), str(box)], stderr=subprocess.PIPE)
    wait_for(lambda: (box / "opened.json").exists() or proc.poll() is not None, "the reader to open")
    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    return proc


def finish_reader(proc: subprocess.Popen, box: Path) -> dict:
    (box / "go").touch()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    return json.loads((box / "after.json").read_text())


def expected_snapshot(path: Path, box: Path) -> dict:
    """What the reader must keep seeing: the cache as it is before the writer runs."""
    proc = start_reader(path, box)
    return finish_reader(proc, box)


def with_held_back_days(tiny_config: Path) -> tuple[PipelineConfig, list[Path]]:
    """Extracted tiny dataset with a cache of all but its last two days, then one day appended (a cache with
    a merged view); returns the config and the day still held back. Appends compact at every append."""
    tiny_config.write_text(tiny_config.read_text() + "cache: {max_appends: 1}\n")
    cfg = load_config(tiny_config)
    run_extract(cfg)
    days = Path(cfg.workspace) / "extracts" / "transactions"
    aside = Path(cfg.workspace) / "held"
    aside.mkdir()
    held = [Path(shutil.move(f, aside / f.name)) for f in sorted(days.glob("*.parquet"))[-2:]]
    run_cache(cfg)
    shutil.copy(held[0], days)
    assert run_cache(cfg)["appends"] == 1
    return cfg, [held[1]]


def add_day(cfg: PipelineConfig, held: list[Path]) -> None:
    """A new day: the cache appends it (compacting its previous segment first)."""
    shutil.copy(held[0], Path(cfg.workspace) / "extracts" / "transactions")


def change_old_day(cfg: PipelineConfig, held: list[Path]) -> None:
    """An old day gains an event of a new household buying a new product: the cache is rebuilt."""
    day = sorted((Path(cfg.workspace) / "extracts" / "transactions").glob("*.parquet"))[10]
    t = pq.read_table(day)
    row = t.slice(0, 1)
    for col, shift in (("household_id", 10**7), ("product_id", 10**7)):
        i = row.schema.get_field_index(col)
        row = row.set_column(i, col, pc.add(row.column(i), pa.scalar(shift, row.column(i).type)))
    pq.write_table(pa.concat_tables([t, row]), day)


def version_dirs(cfg: PipelineConfig) -> list[Path]:
    root = versions.versions_dir(cache_dir(cfg))
    return sorted(p for p in root.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("change", [add_day, change_old_day], ids=["append", "rebuild"])
def test_reader_keeps_its_version_while_the_cache_changes(
    tiny_config: Path, tmp_path: Path, change: Callable[[PipelineConfig, list[Path]], None]
) -> None:
    cfg, held = with_held_back_days(tiny_config)
    final = cache_dir(cfg)
    before = expected_snapshot(final, tmp_path / "expected")
    reader = start_reader(final, tmp_path / "reader")
    opened = json.loads((tmp_path / "reader" / "opened.json").read_text())
    try:
        change(cfg, held)
        started = time.time()
        result = run_cache(cfg)  # the writer does not wait for the reader
        written = time.time()
        assert not result["reused"] and result["events"] > sum(before["n_events"].values())
        # new readers see the writer's result, the running reader still has its version on disk
        new = EventCache(final)
        assert new.path != Path(opened["path"]) and Path(opened["path"]).is_dir()
        assert sum(s.n_events for s in new.sources.values()) == result["events"]
        assert manifest_problems(final)[0] == []
        del new
    finally:
        after = finish_reader(reader, tmp_path / "reader")
    # the reader saw, after the writer finished, exactly what it saw when it opened the cache
    assert opened["t"] < started < written < after["t"]
    for key in ("path", "n_entities", "n_events", "arrays"):
        assert after[key] == opened[key] == before[key], key
    assert after["n_ids"] == after["n_entities"]
    assert (after["entity_ids"], after["vocab"]) == (before["entity_ids"], before["vocab"])
    # once it let go, its version is deleted: only the current one remains, no staging left over
    assert not Path(opened["path"]).exists()
    assert version_dirs(cfg) == [final.resolve()]
    assert not list(final.parent.glob(".*.tmp"))


def test_killed_reader_never_blocks_writers(tiny_config: Path, tmp_path: Path) -> None:
    cfg, held = with_held_back_days(tiny_config)
    final = cache_dir(cfg)
    reader = start_reader(final, tmp_path / "reader")
    held_version = Path(json.loads((tmp_path / "reader" / "opened.json").read_text())["path"])
    assert versions.in_use(held_version)
    reader.send_signal(signal.SIGKILL)
    reader.wait()
    # the kernel released the reader's lock with the process: an exclusive lock is granted at once
    fd = os.open(held_version / versions.READERS_LOCK, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert not versions.in_use(held_version)
    add_day(cfg, held)
    started = time.monotonic()
    assert run_cache(cfg)["appends"] == 2
    assert time.monotonic() - started < 60
    assert not held_version.exists() and version_dirs(cfg) == [final.resolve()]


# Opens the cache over and over until told to stop, checking each version is whole.
OPENER = r"""
import json, sys
from pathlib import Path

from basemodel_pipeline.cache.store import EventCache

path, box = Path(sys.argv[1]), Path(sys.argv[2])
opened, problems = 0, []
while not (box / "stop").exists():
    try:
        with EventCache(path) as cache:
            src = cache.source("transactions")
            if not (len(cache.entity_ids) == cache.n_entities == len(src.offsets) - 1):
                problems.append(f"{len(cache.entity_ids)} ids for {cache.n_entities} entities")
            if src.offsets[-1] != src.n_events or len(src.vocab("product_id")) != src.info["product_id"].vocab_size:
                problems.append("arrays or vocabulary of another version")
    except Exception as exc:
        problems.append(repr(exc))
    opened += 1
    (box / "ready").touch()
(box / "result.json").write_text(json.dumps({"opened": opened, "problems": problems[:5]}))
"""


def test_readers_opening_while_writers_publish_always_get_a_whole_version(
    tiny_config: Path, tmp_path: Path
) -> None:
    cfg, held = with_held_back_days(tiny_config)
    box = tmp_path / "opener"
    box.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", OPENER, str(cache_dir(cfg)), str(box)])
    try:
        wait_for(lambda: (box / "ready").exists() or proc.poll() is not None, "the reader to open")
        for change in (change_old_day, add_day, change_old_day):  # rebuild, append (compacting), rebuild
            change(cfg, held)
            assert not run_cache(cfg)["reused"]
    finally:
        (box / "stop").touch()
        proc.wait(timeout=120)
    result = json.loads((box / "result.json").read_text())
    assert result["problems"] == [] and result["opened"] > 1


def test_a_cache_written_before_versions_becomes_one(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    run_extract(cfg)
    built = run_cache(cfg)
    final = cache_dir(cfg)
    version = final.resolve()
    final.unlink()  # the layout of earlier releases: the cache is the directory itself
    version.rename(final)
    versions.versions_dir(final).rmdir()
    with EventCache(final) as legacy:
        assert legacy.path == final
        again = run_cache(cfg)  # reused: the directory becomes the first version, the reader keeps it
        assert again["reused"] and again["data_version"] == built["data_version"]
        assert final.is_symlink() and legacy.path.resolve() == final.resolve()
        assert legacy.source("transactions").n_events == built["events"]
    assert EventCache(final).path == final.resolve() and manifest_problems(final)[0] == []
