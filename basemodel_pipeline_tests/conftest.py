"""Shared fixtures: a tiny synthetic dataset with a demo-shaped config (basemodel_pipeline.synthetic).

``tiny_dataset`` is written once per session and must not be modified; tests that change the data, the
config or the workspace take ``tiny_config``, a private copy in the test's own tmp_path.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from basemodel_pipeline.synthetic import write_tiny_dataset

try:  # fakesnow.server() the function, taken before anything imports the submodule fakesnow.server, which
    # replaces the package attribute: a second server in one test process would otherwise get the module
    from fakesnow import server as _fakesnow_server
except ImportError:  # pragma: no cover - fakesnow is in requirements.lock
    _fakesnow_server = None


@pytest.fixture(autouse=True)
def _no_leaked_definitions_state():
    """Each test starts without a DefsStateStorage left in Dagster's context variable by an earlier test's
    instance: one that outlived its instance made `defs.resolve_*` fail ("undefined DagsterInstance weakref")
    depending on the order xdist gave the tests."""
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
