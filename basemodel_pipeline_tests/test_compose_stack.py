"""The compose stack up on a real Docker engine: `docker compose up` of PostgreSQL, the code server, the
webserver and the daemon (docker-compose.yml + deploy/compose.local.yml: host networking, PostgreSQL built
from Debian's packages), jobs launched over the webserver's GraphQL, run workers started by DockerRunLauncher
from the code image, runs recorded in that PostgreSQL; then everything torn down, volumes included.

- refresh_and_train runs to SUCCESS; a started run terminated from the UI ends CANCELED.
- With automation stopped, the code server's start has registered the config's scenario partitions. A
  training run holding the `gpu` slot (its step in a trainer container), terminated as the UI does, is
  CANCELED within seconds of its step dying (by its own run worker, not by run monitoring's timeout), its
  trainer container is gone, its slot is free, and the run queued behind it on that slot starts its step;
  the same when that step ignores SIGTERM and Docker has to kill it.

Needs the project's local engine and its images (`deploy/local-engine.sh start && deploy/local-engine.sh
images`, as root); skipped with that instruction when no engine answers.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import requests
import yaml
from conftest import chown_tree, patient, source_digest
from test_orchestration_deploy import (
    LAUNCH,
    LOCATIONS,
    MATERIALIZED,
    STATUS,
    _free_port,
    _gql,
    final_status,
    launch_refresh_and_train,
)
from test_orchestration_deploy import (
    _wait as wait_for,
)

from basemodel_pipeline.config import load_config
from basemodel_pipeline.defs.shared.containers import MANAGED_LABEL, RUN_ID_LABEL, remove_run_containers
from basemodel_pipeline.pipeline import run_cache, run_extract

pytestmark = pytest.mark.timeout(3600)  # its waits are scaled for a busy machine (conftest.patient)

ROOT = Path(__file__).resolve().parents[1]
IMAGES = (
    "basemodel-code:latest",
    "basemodel-dagster:latest",
    "basemodel-postgres:latest",
    "basemodel-trainer:latest",
)
SERVICES = ("postgres", "basemodel_code", "webserver", "daemon")
EVENTS = """
query($id: ID!) { logsForRun(runId: $id, limit: 400) { ... on EventConnection { events { __typename
  ... on MessageEvent { message } ... on EngineEvent { error { message } } } } } }"""
TERMINATE = """
mutation($id: String!) { terminateRun(runId: $id) { __typename ... on PythonError { message }
  ... on TerminateRunFailure { message } } }"""
TRANSIENT = (requests.ConnectionError, requests.HTTPError, KeyError, TypeError)
RELOAD = """
mutation($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) { __typename } }"""
GPU_POOL = """{ instance { concurrencyLimit(concurrencyKey: "gpu") { slotCount
  claimedSlots { runId stepKey } pendingSteps { runId stepKey } } } }"""
FOUNDATION = {  # launchRun's executionParams: foundation_model alone (pool gpu), as the UI's "Materialize"
    "selector": {
        "repositoryLocationName": "basemodel_pipeline",
        "repositoryName": "__repository__",
        "jobName": "__ASSET_JOB",
        "assetSelection": [{"path": ["foundation_model"]}],
    }
}
MONITORING_CANCEL = "seconds to cancel"  # run monitoring's message when it gives up on a CANCELING run


def _wait(predicate, limit_s: float, what: str, logs):
    """test_orchestration_deploy's poll, where GraphQL may also answer with an error or a partial body."""
    return wait_for(predicate, limit_s, what, logs, TRANSIENT, poll_s=2.0)


def _require_stack(docker_engine) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the test hands the workspace to the containers' uid")
    docker_engine.require(*IMAGES)
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no Compose v2 (`docker compose version` failed): {probe.stderr.strip()[:200]}")


@dataclass
class Stack:
    url: str  # the webserver's GraphQL
    password: str  # PostgreSQL's
    pg_port: int
    logs: Callable[[], str]  # the services' last lines

    def gql(self, query: str, **variables: object) -> dict:
        return _gql(self.url, query, **variables)

    def wait(self, predicate, limit_s: float, what: str):
        return _wait(predicate, limit_s, what, self.logs)

    def sql(self, query: str, *params: object) -> list[tuple]:
        con = psycopg2.connect(
            host="127.0.0.1",
            port=self.pg_port,
            user="dagster",
            password=self.password,
            dbname="dagster",
            connect_timeout=10,
        )
        try:
            with con, con.cursor() as cur:
                cur.execute(query, params)
                return cur.fetchall()
        finally:
            con.close()

    def events(self, run_id: str) -> str:
        """The run's event messages, one per line."""
        events = self.gql(EVENTS, id=run_id)["logsForRun"]["events"]
        return "\n".join(
            f"{e['__typename']}: {e.get('message', '')} {(e.get('error') or {}).get('message', '')}"
            for e in events
            if e["__typename"] != "AssetMaterializationPlannedEvent"
        )


@contextmanager
def compose_stack(docker_engine, workspace: Path, tmp_path: Path) -> Iterator[Stack]:
    """PostgreSQL, the code server, the webserver and the daemon up on `workspace` (owned by uid 1000,
    holding config.yaml), steps in trainer containers, automation stopped; down with its volumes after."""
    _require_stack(docker_engine)
    password = secrets.token_hex(12)
    pg_port, ui_port, code_port = _free_port(), _free_port(), _free_port()
    env_file = tmp_path / "compose.env"
    settings = {
        "POSTGRES_PASSWORD": password,
        "POSTGRES_PORT": pg_port,
        "DAGSTER_UI_PORT": ui_port,
        "BASEMODEL_CODE_PORT": code_port,
        "BASEMODEL_WORKSPACE": workspace,
        "DOCKER_SOCKET": docker_engine.socket,
        "BASEMODEL_LAUNCHER": "docker",  # each training step in a trainer container started by the run worker
        "BASEMODEL_TRAINER_IMAGE": "basemodel-trainer:latest",
        "BASEMODEL_GPUS": 0,
        "BASEMODEL_ENV": "ci",
        "BASEMODEL_AUTOMATION": "stopped",  # only the launched runs: no sensor or schedule starts others
        "BASEMODEL_IMAGE_TAG": source_digest()[:12],  # the immutable tag local-engine.sh gave this build
    }
    env_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    project = f"basemodel_test_{secrets.token_hex(4)}"
    compose = ["docker", "compose", "-p", project, "--project-directory", str(ROOT)]
    compose += ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "deploy" / "compose.local.yml")]
    compose += ["--env-file", str(env_file)]
    env = {**os.environ, "DOCKER_HOST": docker_engine.host}

    def logs() -> str:
        out = subprocess.run(
            [*compose, "logs", "--no-color", "--tail", "80"], capture_output=True, text=True, env=env
        )
        return out.stdout + out.stderr

    up = subprocess.run(
        [*compose, "up", "-d", "--no-build", "--wait", "--wait-timeout", "300", *SERVICES],
        capture_output=True,
        text=True,
        env=env,
        timeout=420,
    )
    try:
        assert up.returncode == 0, up.stderr[-3000:] + logs()
        stack = Stack(f"http://127.0.0.1:{ui_port}/graphql", password, pg_port, logs)
        stack.wait(
            lambda: requests.post(stack.url, json={"query": "{ version }"}, timeout=5).ok, 180, "GraphQL"
        )

        def loaded() -> list:
            entries = stack.gql(LOCATIONS)["workspaceOrError"]["locationEntries"]
            ok = [
                e
                for e in entries
                if (e["locationOrLoadError"] or {}).get("__typename") == "RepositoryLocation"
            ]
            if not ok:  # the webserver may have asked before the code server listened: ask again
                stack.gql(RELOAD, name="basemodel_pipeline")
            return ok

        entries = stack.wait(loaded, 240, "the code location loading from the code server")
        assert [e["name"] for e in entries] == ["basemodel_pipeline"]
        yield stack
        assert password not in logs()  # the password never reached the services' logs
    finally:
        down = subprocess.run(
            [*compose, "down", "--volumes", "--remove-orphans", "--timeout", "20"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    assert down.returncode == 0, down.stderr
    left = docker_engine.client.containers.list(
        all=True, filters={"label": f"com.docker.compose.project={project}"}
    )
    assert not left
    volumes = docker_engine.client.volumes.list(filters={"label": f"com.docker.compose.project={project}"})
    assert not volumes


def test_compose_stack_runs_the_job(docker_engine, tiny_dataset: Path, tmp_path: Path) -> None:
    _require_stack(docker_engine)
    # the workspace: the tiny data and its config, owned by the images' user
    workspace = tmp_path / "srv"
    shutil.copytree(tiny_dataset.parent / "data", workspace / "data")
    shutil.copy(tiny_dataset, workspace / "config.yaml")
    chown_tree(workspace, 1000, 1000)

    run_id = container_id = None
    with compose_stack(docker_engine, workspace, tmp_path) as stack:
        try:
            url = stack.url
            run_id = launch_refresh_and_train(url)
            status = stack.wait(lambda: final_status(url, run_id), 600, "the run ending")
            if status != "SUCCESS":
                pytest.fail(f"the run ended {status}; its events:\n{stack.events(run_id)[-6000:]}")
            for path in (["foundation_model"], ["event_cache"], ["entity_embeddings"]):
                mats = stack.gql(MATERIALIZED, path=path)["assetOrError"]["assetMaterializations"]
                assert mats and mats[0]["runId"] == run_id, path
            assert (workspace / "checkpoints" / "foundation" / "LATEST").exists()  # on the host's volume

            # the step logs outlive the run worker: on the workspace volume, where the webserver reads them
            step_logs = [p for p in (workspace / ".dagster" / "compute_logs").rglob("*") if p.is_file()]
            assert any(run_id in str(p) for p in step_logs), step_logs[:5]

            # the run is in the stack's PostgreSQL, launched into a container by DockerRunLauncher
            assert stack.sql("SELECT status FROM runs WHERE run_id = %s", run_id) == [("SUCCESS",)]
            ((container_id,),) = stack.sql(
                "SELECT value FROM run_tags WHERE run_id = %s AND key = 'docker/container_id'", run_id
            )
            launched_in = [
                line
                for line in stack.events(run_id).splitlines()
                if "Launching run in a new container" in line
            ]
            tag = source_digest()[:12]  # the immutable tag, not :latest
            (message,) = launched_in
            assert message.rstrip().endswith(
                f"Launching run in a new container {container_id} with image basemodel-code:{tag}"
            )
            # the exited run worker is removed by the run-status sensor (BASEMODEL_RUN_LAUNCHER=docker)
            stack.wait(
                lambda: not docker_engine.client.containers.list(all=True, filters={"id": container_id}),
                180,
                "the finished run worker removed",
            )
            # trainer containers ran for the run's steps and were removed, the run worker was left to finish
            assert not _trainers(docker_engine, run_id, all=True)

            # "Terminate" from the UI (GraphQL) stops a started run: the webserver reaches the engine too
            second_id = launch_refresh_and_train(url)
            stack.wait(
                lambda: stack.gql(STATUS, id=second_id)["runOrError"]["status"] == "STARTED", 180, "a start"
            )
            terminated = stack.gql(TERMINATE, id=second_id)["terminateRun"]
            assert terminated["__typename"] == "TerminateRunSuccess", terminated
            status = stack.wait(lambda: final_status(url, second_id), 180, "the terminated run ending")
            assert status == "CANCELED"
            # the run-status sensors remove what a run left, run worker included (BASEMODEL_AUTOMATION=stopped
            # leaves them running: they are housekeeping, not automation)
            stack.wait(
                lambda: not _run_containers(docker_engine, second_id),
                180,
                "the cancelled run's containers removed",
            )
        finally:
            if run_id:
                remove_run_containers(run_id, docker_engine.client)
            if container_id:  # the run worker (DockerRunLauncher's container is not part of the project)
                for c in docker_engine.client.containers.list(all=True, filters={"id": container_id}):
                    c.remove(force=True)


def _run_containers(docker_engine, run_id: str) -> list:
    """Every container of the run: its run worker and its trainer containers."""
    return docker_engine.client.containers.list(all=True, filters={"label": f"{RUN_ID_LABEL}={run_id}"})


def _trainers(docker_engine, run_id: str, all: bool = False) -> list:  # noqa: A002 - docker's own name
    """The run's trainer containers (the launcher's own label), running ones unless `all`."""
    labels = [f"{RUN_ID_LABEL}={run_id}", f"{MANAGED_LABEL}=true"]
    return docker_engine.client.containers.list(all=all, filters={"label": labels})


def _launch(stack: Stack, params: dict[str, Any]) -> str:
    launched = stack.gql(LAUNCH, params=params)["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def _terminate(stack: Stack, run_id: str) -> float:
    """Terminate the run as the UI's "Terminate" does; the seconds until it was CANCELED."""
    started = time.monotonic()
    terminated = stack.gql(TERMINATE, id=run_id)["terminateRun"]
    assert terminated["__typename"] == "TerminateRunSuccess", terminated
    # well under run monitoring's cancel timeout (150 s, deploy/dagster.yaml): the run worker itself must
    # report the cancellation once its step has stopped
    limit = min(patient(30), 120)
    status = _wait(
        lambda: final_status(stack.url, run_id),
        limit / patient(1),
        f"run {run_id} CANCELED",
        lambda: f"{stack.logs()[-2500:]}\nthe run's events:\n{stack.events(run_id)[-3000:]}",
    )
    elapsed = time.monotonic() - started
    events = stack.events(run_id)
    assert status == "CANCELED", f"the terminated run ended {status}:\n{events[-4000:]}"
    assert MONITORING_CANCEL not in events, events[-4000:]
    return elapsed


def test_a_terminated_training_run_frees_its_gpu_slot_for_the_next(
    docker_engine, tiny_dataset: Path, tmp_path: Path
) -> None:
    _require_stack(docker_engine)
    workspace = tmp_path / "srv"
    shutil.copytree(tiny_dataset.parent / "data", workspace / "data")
    config = yaml.safe_load(tiny_dataset.read_text())
    # the foundation trains until it is terminated
    config["training_params"]["foundation"].update(epochs=100_000, patience=100_000)
    (workspace / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cfg = load_config(workspace / "config.yaml")
    run_extract(cfg)
    run_cache(cfg)
    chown_tree(workspace, 1000, 1000)

    run_ids: list[str] = []
    with compose_stack(docker_engine, workspace, tmp_path) as stack:
        try:
            # automation is stopped: the code server's start registered the config's scenarios
            partitions = stack.sql(
                "SELECT partition FROM dynamic_partitions WHERE partitions_def_name = 'scenarios' ORDER BY id"
            )
            assert [p for (p,) in partitions] == [sc["name"] for sc in config["scenarios"]]

            def pool() -> dict:
                return stack.gql(GPU_POOL)["instance"]["concurrencyLimit"]

            first = _launch(stack, FOUNDATION)
            run_ids.append(first)
            stack.wait(lambda: _trainers(docker_engine, first), 300, "the first run's trainer container")
            second = _launch(stack, FOUNDATION)  # behind it: the queue holds it while the gpu slot is taken
            run_ids.append(second)
            status = stack.gql(STATUS, id=second)["runOrError"]["status"]
            assert status in {"QUEUED", "STARTING", "STARTED"}, status
            assert pool()["slotCount"] == 1
            assert [s["runId"] for s in pool()["claimedSlots"]] == [first]

            took = _terminate(stack, first)
            print(f"first run CANCELED {took:.1f} s after terminate")
            assert not _trainers(docker_engine, first, all=True)  # its step's container is gone
            assert first not in [s["runId"] for s in pool()["claimedSlots"]]
            stack.wait(lambda: _trainers(docker_engine, second), 180, "the second run's step starting")
            assert [s["runId"] for s in pool()["claimedSlots"]] == [second]

            # a step that does not answer SIGTERM (stopped here; in production a GPU process slow to unwind):
            # Docker kills its trainer container 10 s after the stop, and its run worker, given longer than
            # that, still records the cancellation and releases the slot itself
            (trainer,) = _trainers(docker_engine, second)
            trainer.kill(signal="SIGSTOP")
            took = _terminate(stack, second)
            print(f"second run (its step frozen) CANCELED {took:.1f} s after terminate")
            assert not _trainers(docker_engine, second, all=True)
            assert not pool()["claimedSlots"] and not pool()["pendingSteps"]
            for run_id in run_ids:  # the run-status sensor removes the run workers too
                stack.wait(lambda r=run_id: not _run_containers(docker_engine, r), 180, "run workers removed")
        finally:
            for run_id in run_ids:
                remove_run_containers(run_id, docker_engine.client)
