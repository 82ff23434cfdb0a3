"""No stage deletes what it did not write, through a symlinked cache/ either: the cache's writer sweeps only
its own published versions (a version's name and its manifest), and leaves the user's files on that volume."""

from __future__ import annotations

from pathlib import Path

from basemodel_pipeline.config import load_config
from basemodel_pipeline.pipeline import run_cache, run_extract


def test_cache_updates_through_a_symlinked_cache_directory_remove_only_their_own_versions(
    tiny_config: Path, tmp_path: Path
) -> None:
    cfg = load_config(tiny_config)
    workspace = Path(cfg.workspace)
    volume = tmp_path / "other_volume"
    volume.mkdir()
    (workspace / "cache").symlink_to(volume, target_is_directory=True)
    (volume / "notes.txt").write_text("the user's own")
    (volume / ".notes.tmp").write_text("the user's own")
    run_extract(cfg)
    late = sorted((workspace / "extracts" / "transactions").glob("*.parquet"))[-2:]
    for day in late:  # the cache first without the last two days, which then land one by one
        day.rename(tmp_path / day.name)
    first = Path(run_cache(cfg)["path"]).resolve()
    versions = first.parent  # cache/<fingerprint>.versions, on the other volume
    assert versions.parent == volume.resolve()
    foreign = [versions / "20200101T000000000000Z", versions / "backup"]  # named like a version, or not
    for d in foreign:
        d.mkdir()
        (d / "a.parquet").write_text("the user's own")
    for day in late:  # each append publishes a version and sweeps the ones before it
        (tmp_path / day.name).rename(day)
        newest = Path(run_cache(cfg)["path"]).resolve()
    kept = {p.name for p in versions.iterdir() if not p.name.startswith(".")}
    assert kept == {d.name for d in foreign} | {newest.name}
    assert all((d / "a.parquet").read_text() == "the user's own" for d in foreign)
    assert not any((d / ".readers.lock").exists() for d in foreign)  # not even a lock file made in them
    assert (volume / "notes.txt").read_text() == "the user's own"
    assert (volume / ".notes.tmp").read_text() == "the user's own"
