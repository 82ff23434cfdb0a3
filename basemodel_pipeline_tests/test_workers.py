"""Scoring in worker processes: `run_predict` with ScoringOptions(workers=K) never starts more processes than the
cores and free memory allow, starts them as Python workers (never the CLI), and reports a worker's error."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.inference import shards, workers
from basemodel_pipeline.inference.options import ScoringOptions
from basemodel_pipeline.pipeline import run_cache, run_extract, run_finetune, run_predict, run_pretrain
from basemodel_pipeline.progress import NullProgress

GIB = 2**30


@pytest.mark.parametrize(
    ("requested", "cores", "free", "expected", "message"),
    [
        (64, 2, 3.1 * GIB, 2, "workers 64 capped to 2: 2 cores, 3.1 GiB free at ~400 MB per worker"),
        (8, 16, 1.0 * GIB, 2, "workers 8 capped to 2: 16 cores, 1.0 GiB free at ~400 MB per worker"),
        (4, 1, 0.1 * GIB, 1, "workers 4 capped to 1: 1 core, 0.1 GiB free at ~400 MB per worker"),
        (2, 16, 64.0 * GIB, 2, None),
        (3, 16, None, 3, None),  # free memory unknown: cores only
    ],
)
def test_worker_cap_by_cores_and_memory(
    requested: int, cores: int, free: float | None, expected: int, message: str | None
) -> None:
    assert workers.cap_workers(requested, cores, None if free is None else int(free)) == (expected, message)


def test_the_machine_is_measured() -> None:
    assert workers.usable_cores() >= 1
    free = workers.available_memory()
    assert free is None or free > 0


@pytest.mark.parametrize("count", [0, -3])
def test_workers_below_one_is_a_user_error(count: int) -> None:
    with pytest.raises(UserError, match=f"^workers {count}: give a number of worker processes of at least 1"):
        ScoringOptions(workers=count)


def test_a_run_has_one_layout() -> None:
    with pytest.raises(UserError, match="^workers: cannot be combined with shard: choose one layout per run"):
        ScoringOptions(workers=2, shard=(0, 2))
    with pytest.raises(UserError, match="^shard 2/2: write I/K"):
        ScoringOptions(shard=(2, 2))
    assert ScoringOptions().single and not ScoringOptions(merge_shards=2).single


def test_predict_with_more_workers_than_cores_runs_at_most_the_cap(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = yaml.safe_load(tiny_config.read_text())
    raw["training_params"]["foundation"].update(epochs=1, hidden_dim=16, num_blocks=1)
    raw["training_params"]["finetune"].update(epochs=1)
    tiny_config.write_text(yaml.safe_dump(raw))
    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    run_finetune(cfg, "churn")
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)  # a small machine: 2 cores, 3.1 GiB
    monkeypatch.setattr(workers, "available_memory", lambda: int(3.1 * GIB))
    pools: list[int] = []
    real_pool = workers.ProcessPoolExecutor

    def counting_pool(count: int, context: object, **kwargs: object) -> object:
        pools.append(count)
        assert context.get_start_method() == "spawn"  # type: ignore[attr-defined]
        return real_pool(count, context, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(workers, "ProcessPoolExecutor", counting_pool)
    log: list[str] = []

    class Capture(NullProgress):
        def log(self, message: str) -> None:
            log.append(message)

    single = pq.read_table(run_predict(cfg, "churn", ScoringOptions(precision="fp32"))["path"])
    out = run_predict(cfg, "churn", ScoringOptions(workers=4, precision="fp32"), progress=Capture())
    assert pools == [2] and out["workers"] == 2 and out["shards"] == 2 and out["workers_requested"] == 4
    assert "workers 4 capped to 2: 2 cores, 3.1 GiB free at ~400 MB per worker" in log, log
    assert pq.read_table(out["path"]).equals(single)  # the table of one process
    as_of = shards.default_as_of(shards.EventCache(shards.cache_dir(cfg)))
    assert len(list(shards.parts_dir(cfg, "churn", as_of, 2).glob("part-*.parquet"))) == 2
    assert not shards.parts_dir(cfg, "churn", as_of, 4).exists()
    if not torch.cuda.is_available():  # a worker's user error comes back as one line naming its shard
        with pytest.raises(UserError, match=r"^shard 0/2: device cuda: no CUDA device is visible here"):
            run_predict(cfg, "churn", ScoringOptions(workers=2, device="cuda"))


def test_the_library_never_starts_its_own_cli_nor_reads_argv() -> None:
    """Scoring with workers used to re-run `basemodel predict` with the caller's sys.argv: below the faces
    (cli/, entrypoints/, defs/) no module reads sys.argv or names the CLI module."""
    import ast

    import basemodel_pipeline

    root = Path(basemodel_pipeline.__file__).parent
    faces = {"cli", "__main__.py", "entrypoints", "defs", "definitions.py"}
    offenders = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] in faces:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            argv = isinstance(node, ast.Attribute) and node.attr == "argv"
            cli = isinstance(node, ast.Constant) and node.value == "basemodel_pipeline.cli"
            if argv or cli:
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders
