"""The compose stack up on a real Docker engine: `docker compose up` of PostgreSQL, the code server, the
webserver and the daemon (docker-compose.yml + deploy/compose.local.yml: host networking, PostgreSQL built
from Debian's packages), the refresh_and_train job launched over the webserver's GraphQL, its run worker
started by DockerRunLauncher from the code image, the run recorded in that PostgreSQL; then everything torn
down, volumes included.

Needs the project's local engine and its images (`deploy/local-engine.sh start && deploy/local-engine.sh
images`, as root); skipped with that instruction when no engine answers.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import psycopg2
import pytest
import requests
from conftest import chown_tree, source_digest
from test_orchestration_deploy import (
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

from basemodel_pipeline.defs.shared.containers import remove_run_containers

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


def _wait(predicate, limit_s: float, what: str, logs):
    """test_orchestration_deploy's poll, where GraphQL may also answer with an error or a partial body."""
    return wait_for(predicate, limit_s, what, logs, TRANSIENT, poll_s=2.0)


def test_compose_stack_runs_the_job(docker_engine, tiny_dataset: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the test hands the workspace to the containers' uid")
    docker_engine.require(*IMAGES)
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no Compose v2 (`docker compose version` failed): {probe.stderr.strip()[:200]}")

    # the workspace: the tiny data and its config, owned by the images' user
    workspace = tmp_path / "srv"
    shutil.copytree(tiny_dataset.parent / "data", workspace / "data")
    shutil.copy(tiny_dataset, workspace / "config.yaml")
    chown_tree(workspace, 1000, 1000)

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
        "BASEMODEL_AUTOMATION": "stopped",  # only the launched run: no sensor or schedule starts others
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

    run_id = container_id = None
    up = subprocess.run(
        [*compose, "up", "-d", "--no-build", "--wait", "--wait-timeout", "300", *SERVICES],
        capture_output=True,
        text=True,
        env=env,
        timeout=420,
    )
    try:
        assert up.returncode == 0, up.stderr[-3000:] + logs()
        url = f"http://127.0.0.1:{ui_port}/graphql"
        _wait(lambda: requests.post(url, json={"query": "{ version }"}, timeout=5).ok, 180, "GraphQL", logs)

        def loaded() -> list:
            entries = _gql(url, LOCATIONS)["workspaceOrError"]["locationEntries"]
            ok = [
                e
                for e in entries
                if (e["locationOrLoadError"] or {}).get("__typename") == "RepositoryLocation"
            ]
            if not ok:  # the webserver may have asked before the code server listened: ask again
                _gql(url, RELOAD, name="basemodel_pipeline")
            return ok

        entries = _wait(loaded, 240, "the code location loading from the code server", logs)
        assert [e["name"] for e in entries] == ["basemodel_pipeline"]
        run_id = launch_refresh_and_train(url)
        status = _wait(
            lambda: final_status(url, run_id),
            600,
            "the run ending",
            logs,
        )
        if status != "SUCCESS":
            events = _gql(url, EVENTS, id=run_id)["logsForRun"]["events"]
            messages = "\n".join(
                f"{e['__typename']}: {e.get('message', '')} {(e.get('error') or {}).get('message', '')}"
                for e in events
                if e["__typename"] != "AssetMaterializationPlannedEvent"
            )
            pytest.fail(f"the run ended {status}; its events:\n{messages[-6000:]}")
        for path in (["foundation_model"], ["event_cache"], ["entity_embeddings"]):
            mats = _gql(url, MATERIALIZED, path=path)["assetOrError"]["assetMaterializations"]
            assert mats and mats[0]["runId"] == run_id, path
        assert (workspace / "checkpoints" / "foundation" / "LATEST").exists()  # written on the host's volume

        # the step logs outlive the run worker: on the workspace volume, where the webserver reads them
        step_logs = [p for p in (workspace / ".dagster" / "compute_logs").rglob("*") if p.is_file()]
        assert any(run_id in str(p) for p in step_logs), step_logs[:5]

        # the run is in the stack's PostgreSQL, launched into a container by DockerRunLauncher
        con = psycopg2.connect(
            host="127.0.0.1",
            port=pg_port,
            user="dagster",
            password=password,
            dbname="dagster",
            connect_timeout=10,
        )
        with con, con.cursor() as cur:
            cur.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
            assert cur.fetchone() == ("SUCCESS",)
            cur.execute(
                "SELECT value FROM run_tags WHERE run_id = %s AND key = 'docker/container_id'", (run_id,)
            )
            (container_id,) = cur.fetchone()
        con.close()
        events = _gql(url, EVENTS, id=run_id)["logsForRun"]["events"]
        launched_in = [
            e["message"] for e in events if "Launching run in a new container" in e.get("message", "")
        ]
        tag = source_digest()[:12]  # the immutable tag, not :latest
        (message,) = launched_in
        assert message.endswith(
            f"Launching run in a new container {container_id} with image basemodel-code:{tag}"
        )
        # the exited run worker is removed by the run-status sensor (BASEMODEL_RUN_LAUNCHER=docker)
        _wait(
            lambda: not docker_engine.client.containers.list(all=True, filters={"id": container_id}),
            180,
            "the finished run worker removed",
            logs,
        )
        # trainer containers ran for the run's steps and were removed, the run worker was left to finish
        assert not docker_engine.client.containers.list(
            all=True, filters={"label": [f"dagster/run_id={run_id}", "basemodel/managed=true"]}
        )

        # "Terminate" from the UI (GraphQL) stops a started run: the webserver reaches the engine too
        second_id = launch_refresh_and_train(url)
        _wait(
            lambda: _gql(url, STATUS, id=second_id)["runOrError"]["status"] == "STARTED", 180, "a start", logs
        )
        terminated = _gql(url, TERMINATE, id=second_id)["terminateRun"]
        assert terminated["__typename"] == "TerminateRunSuccess", terminated
        status = _wait(
            lambda: final_status(url, second_id),
            180,
            "the terminated run ending",
            logs,
        )
        assert status == "CANCELED"
        # the run-status sensors remove what a run left, run worker included (BASEMODEL_AUTOMATION=stopped
        # leaves them running: they are housekeeping, not automation)
        _wait(
            lambda: (
                not docker_engine.client.containers.list(
                    all=True, filters={"label": f"dagster/run_id={second_id}"}
                )
            ),
            180,
            "the cancelled run's containers removed",
            logs,
        )

        # the password never reached the run's logs
        assert password not in logs()
    finally:
        down = subprocess.run(
            [*compose, "down", "--volumes", "--remove-orphans", "--timeout", "20"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        if run_id:
            remove_run_containers(run_id, docker_engine.client)
        if container_id:  # the run worker (DockerRunLauncher's container is not part of the compose project)
            for c in docker_engine.client.containers.list(all=True, filters={"id": container_id}):
                c.remove(force=True)
    assert down.returncode == 0, down.stderr
    left = docker_engine.client.containers.list(
        all=True, filters={"label": f"com.docker.compose.project={project}"}
    )
    assert not left
    volumes = docker_engine.client.volumes.list(filters={"label": f"com.docker.compose.project={project}"})
    assert not volumes
