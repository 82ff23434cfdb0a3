"""Shared fixtures: a tiny synthetic dataset with a demo-shaped config (basemodel_pipeline.demo.synthetic).

``tiny_dataset`` is written once per session and must not be modified; tests that change the data, the
config or the workspace take ``tiny_config``, a private copy in the test's own tmp_path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from basemodel_pipeline.demo.synthetic import write_tiny_dataset

try:  # fakesnow.server() the function, taken before anything imports the submodule fakesnow.server, which
    # replaces the package attribute: a second server in one test process would otherwise get the module
    from fakesnow import server as _fakesnow_server
except ImportError:  # pragma: no cover - fakesnow is in requirements.lock
    _fakesnow_server = None


# ---------------------------------------------------------------- the development loop and a busy machine

# `make test-fast` runs these modules only (-m "not slow"): unit-sized tests, under 3 minutes on two quiet
# cores. Every other module (a trained foundation, Dagster runs, warehouses' emulators, containers) is marked
# `slow` and runs in `make test`. A new module is slow until it is listed here.
FAST_MODULES = {
    "test_architecture",
    "test_candidate_conformance",
    "test_code_versions",
    "test_config",
    "test_cooccurrence",
    "test_damaged_files",
    "test_demo_datasets",
    "test_evaluation",
    "test_feature_kernels",
    "test_features",
    "test_fit",
    "test_fuzz_user_errors",
    "test_import_graph",
    "test_inference_state",
    "test_input_hygiene",
    "test_outputs",
    "test_resampling",
    "test_results_page",
    "test_scenarios_config",
    "test_scenarios_targets",
    "test_scoring_options",
    "test_selection",
    "test_sources_config",
    "test_sources_extract",
    "test_sources_retry",
    "test_sources_suggest",
    "test_sources_support",
    "test_sources_volume",
    "test_tasks",
    "test_test_windows",
    "test_workspace",
}
# Deadlines of tests that wait for something (a server, a run, a child process) are what a quiet machine needs
# times this factor, so a machine four times slower (a loaded CI runner) fails none of them.
TIME_SCALE = float(os.environ.get("BASEMODEL_TEST_TIME_SCALE", "4"))


def patient(seconds: float) -> float:
    """A wait's deadline: `seconds` (enough on a quiet machine) times TIME_SCALE."""
    return seconds * TIME_SCALE


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] not in FAST_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_leaked_definitions_state():
    """Each test starts without a DefsStateStorage left in Dagster's context variable by an earlier test's
    instance: one that outlived its instance made `defs.resolve_*` fail ("undefined DagsterInstance weakref")
    depending on the order xdist gave the tests. (Dagster has no public API to reset it: a private import,
    in the tests only.)"""
    from dagster._core.storage.defs_state.base import set_defs_state_storage

    with set_defs_state_storage(None):
        yield


@pytest.fixture(scope="session")
def fakesnow_start():
    """fakesnow's server() context manager (yields connection kwargs)."""
    if _fakesnow_server is None:
        pytest.skip("fakesnow is not installed")
    return _fakesnow_server


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of config.yaml of the shared, read-only tiny dataset."""
    return write_tiny_dataset(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def tiny_config(tiny_dataset: Path, tmp_path: Path) -> Path:
    """Path of config.yaml in a private copy of the tiny dataset (data/ and config.yaml) under tmp_path."""
    shutil.copytree(tiny_dataset.parent / "data", tmp_path / "data")
    return Path(shutil.copy(tiny_dataset, tmp_path / "config.yaml"))


@pytest.fixture(scope="session")
def tiny_trained(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.yaml of a copy of the tiny dataset with its extracts, cache, a foundation and the 'churn'
    scenario, made once per session: never modified (copy its directory with symlinks=True to change it)."""
    from basemodel_pipeline.config import load_config
    from basemodel_pipeline.pipeline import run_cache, run_extract, run_finetune, run_pretrain

    d = tmp_path_factory.mktemp("trained")
    shutil.copytree(tiny_dataset.parent / "data", d / "data")
    config = Path(shutil.copy(tiny_dataset, d / "config.yaml"))
    cfg = load_config(config)
    run_extract(cfg)
    run_cache(cfg)
    run_pretrain(cfg)
    run_finetune(cfg, "churn")
    return config


@pytest.fixture(scope="session")
def tiny_scored(tiny_trained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.yaml of a copy of `tiny_trained` with every kind of artifact: extracts, cache, foundation,
    'churn', its predictions (and state) with a subset of three entities ('vip'), and embeddings; made once
    per session and never modified (copy its directory with symlinks=True to change it)."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from basemodel_pipeline.cli import app

    d = tmp_path_factory.mktemp("scored") / "ws"
    shutil.copytree(tiny_trained.parent, d, symlinks=True)
    config = str(d / "config.yaml")
    runner = CliRunner()

    def ok(*args: str) -> None:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, (args, result.output, result.exception)

    ok("predict", config, "-s", "churn")
    [table] = (d / "predictions" / "churn").glob("*/predictions.parquet")
    ids = [str(v) for v in pq.read_table(table)["entity_id"].to_pylist()[:3]]
    (d / "vip.txt").write_text("\n".join(ids) + "\n")
    ok("predict", config, "-s", "churn", "--entities", str(d / "vip.txt"))
    ok("embed", config)
    return Path(config)


# ---------------------------------------------------------------- a real Docker engine (deploy/local-engine.sh)

LOCAL_ENGINE_SOCKET = "/run/basemodel-engine/docker.sock"
ENGINE_HOW = "run `deploy/local-engine.sh start && deploy/local-engine.sh images` as root (or `make engine`)"


def source_digest() -> str:
    """What deploy/local-engine.sh labels its images with: sha256 over `sha256sum` lines of the sorted
    Python sources of basemodel_pipeline/."""
    root = Path(__file__).resolve().parents[1]
    files = sorted(
        p.relative_to(root).as_posix()
        for p in (root / "basemodel_pipeline").rglob("*.py")
        if "__pycache__" not in p.parts
    )
    lines = "".join(f"{hashlib.sha256((root / f).read_bytes()).hexdigest()}  {f}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give a directory tree to uid:gid (a workspace handed to a container's user)."""
    for path in [root, *root.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)


@dataclass
class DockerEngine:
    client: Any  # docker.DockerClient
    host: str  # DOCKER_HOST form: unix:///path

    @property
    def socket(self) -> str:
        return self.host.removeprefix("unix://")

    def require(self, *images: str) -> None:
        """Skip unless the engine holds these images; fail if one was built from other sources than these
        (a stale image would test old code)."""
        for name in images:
            try:
                image = self.client.images.get(name)
            except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound and API errors alike
                pytest.skip(f"the Docker engine at {self.host} has no image {name}: {ENGINE_HOW}")
            if name.startswith("local/"):  # the base image: no project sources in it
                continue
            if (image.labels or {}).get("basemodel.source_digest") != source_digest():
                pytest.fail(
                    f"{name} was built from other sources than these: run `deploy/local-engine.sh images`"
                )


@pytest.fixture(scope="session")
def docker_engine():
    """The project's local Docker engine (or DOCKER_HOST's), with DOCKER_HOST pointing at it for the
    session (PipesDockerClient and the cleanup use docker.from_env()); skipped with how to start one."""
    docker = pytest.importorskip("docker")
    host = os.environ.get("DOCKER_HOST") or (
        f"unix://{LOCAL_ENGINE_SOCKET}" if Path(LOCAL_ENGINE_SOCKET).exists() else ""
    )
    if not host:
        pytest.skip(f"no Docker engine: {ENGINE_HOW}")
    try:
        client = docker.DockerClient(base_url=host)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the engine skips
        pytest.skip(f"no Docker engine answers at {host} ({type(exc).__name__}): {ENGINE_HOW}")
    saved = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = host
    yield DockerEngine(client, host)
    if saved is None:
        os.environ.pop("DOCKER_HOST", None)
    else:
        os.environ["DOCKER_HOST"] = saved
    client.close()
