"""The deployment: deploy/dagster.yaml on a real PostgreSQL, docker-compose.yml and the Dockerfile as data
(and through `docker compose config` where the compose plugin exists), and `dagster dev` on PostgreSQL
launching the refresh_and_train job over GraphQL on the tiny data, then shutting down cleanly."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import pytest
import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh database on the PostgreSQL at 127.0.0.1:5432 (trust auth), dropped afterwards."""
    try:
        admin = psycopg2.connect(dbname="postgres", connect_timeout=5, **PG)
    except psycopg2.OperationalError as err:
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432 to test against ({str(err).strip()})")
    admin.autocommit = True
    name = f"basemodel_test_{uuid.uuid4().hex[:12]}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg2://{PG['user']}@{PG['host']}:{PG['port']}/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


def test_deploy_instance_config_on_postgres(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg
    from dagster_docker import DockerRunLauncher
    from dagster_postgres import PostgresRunStorage

    shutil.copy(ROOT / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", postgres_url)
    monkeypatch.setenv("BASEMODEL_DOCKER_NETWORK", "basemodel_network")  # docker-compose.yml sets these
    monkeypatch.setenv("BASEMODEL_COMPUTE_LOGS_DIR", str(tmp_path / "compute_logs"))
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.run_launcher, DockerRunLauncher)
        assert isinstance(instance.run_coordinator, dg.QueuedRunCoordinator)
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_resume_run_attempts == 2
        # a terminated run gives its pool slots (the single gpu slot) back: the daemon's monitoring frees them
        # this long after the run ended, and a CANCELING run is CANCELED after the trainers' stop timeout
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] == 10
        assert 120 < instance.run_monitoring_settings["cancel_timeout_seconds"] <= 150
        # a terminated run worker gets longer than its steps take to stop (trainer containers: Docker's 10 s;
        # subprocess steps: the launcher's 120 s), so it records CANCELED and frees its slots itself; and
        # less than run monitoring's cancel timeout, which only covers a run worker that died
        stop_timeout = instance.run_launcher.container_kwargs["stop_timeout"]
        assert 120 < stop_timeout < instance.run_monitoring_settings["cancel_timeout_seconds"]
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        assert "/srv/basemodel:/srv/basemodel" in instance.run_launcher.container_kwargs["volumes"]
        assert instance.run_launcher.networks == ["basemodel_network"]
        instance.event_log_storage.set_concurrency_slots("gpu", 2)  # what the daemon's start command does
        assert instance.event_log_storage.get_concurrency_info("gpu").slot_count == 2
    finally:
        instance.dispose()


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_services_as_data() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"postgres", "basemodel_code", "webserver", "daemon", "trainer"}
    env = services["basemodel_code"]["environment"]
    assert env["DAGSTER_POSTGRES_URL"].startswith("postgresql+psycopg2://")
    workspace = "${BASEMODEL_WORKSPACE:-/srv/basemodel}"
    assert (
        env["BASEMODEL_WORKSPACE_DIR"] == workspace
        and env["DAGSTER_CURRENT_IMAGE"] == "basemodel-code:${BASEMODEL_IMAGE_TAG:-latest}"
    )
    for name in ("basemodel_code", "trainer"):  # the workspace at the same path in host and container
        assert f"{workspace}:{workspace}" in services[name]["volumes"]
    trainer = services["trainer"]
    assert trainer["profiles"] == ["gpu"] and trainer["build"]["target"] == "trainer"
    (device,) = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "cu128" in trainer["build"]["args"]["TORCH_INDEX"]
    assert "nvidia/cuda" in trainer["build"]["args"]["BASE_IMAGE"]
    assert "dagster instance concurrency set gpu" in " ".join(services["daemon"]["command"])
    assert services["webserver"]["ports"] == ["${DAGSTER_UI_BIND:-127.0.0.1}:3000:3000"]
    assert services["postgres"]["healthcheck"]["test"][0] == "CMD-SHELL"


# Settings the library reads that run workers must not (or need not) receive, and why.
NOT_FOR_RUN_WORKERS = {
    "BASEMODEL_FORWARDED_ENV": "set by the launcher for each step, not by the deployment",
    "BASEMODEL_SLACK_TOKEN": "a secret used by the alert sensors in the daemon / code server only",
    "BASEMODEL_SLACK_CHANNEL": "alert sensors only",
    "BASEMODEL_ALERT_WEBHOOK_URL": "alert sensors only (the URL may hold a token)",
    "BASEMODEL_ALERT_REMINDER_S": "alert sensors only",
    "BASEMODEL_ONLINERETAIL_WHEEL": "a demo data set's wheel: `basemodel demo` and the quality benchmark only",
}


def test_every_setting_reaches_run_workers_and_is_set_in_the_daemon() -> None:
    """DockerRunLauncher fails a run at dequeue ("Tried to load environment variable X, but it was not set")
    when a name in dagster.yaml's env_vars is missing from the daemon's environment; and a setting the
    library reads but the run launcher does not pass on silently has no effect in run workers."""
    instance = yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text())
    passed = [v for v in instance["run_launcher"]["config"]["env_vars"] if "=" not in v]
    image_env = {"BASEMODEL_DUCKDB_EXTENSIONS"}  # ENV of the images (deploy/Dockerfile, stage base)
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "BASEMODEL_DUCKDB_EXTENSIONS=/opt/basemodel/duckdb_extensions" in dockerfile
    daemon_env = set(_compose()["services"]["daemon"]["environment"])
    missing = [n for n in passed if n not in daemon_env and n not in image_env]
    assert not missing, f"set these in docker-compose.yml's x-basemodel-env: {missing}"

    read = set()
    for path in (ROOT / "basemodel_pipeline").rglob("*.py"):
        read |= set(re.findall(r'"(BASEMODEL_[A-Z0-9_]+)"', path.read_text()))
    not_passed = sorted(read - set(passed) - set(NOT_FOR_RUN_WORKERS))
    assert not not_passed, (
        f"add to deploy/dagster.yaml run_launcher env_vars (or NOT_FOR_RUN_WORKERS): {not_passed}"
    )
    for name in NOT_FOR_RUN_WORKERS:
        assert name not in passed and name in read
    alerts = {
        "BASEMODEL_SLACK_TOKEN",
        "BASEMODEL_SLACK_CHANNEL",
        "BASEMODEL_ALERT_WEBHOOK_URL",
        "BASEMODEL_ALERT_REMINDER_S",
    }
    assert alerts <= daemon_env and alerts <= set(_compose()["services"]["basemodel_code"]["environment"])


def test_dockerfile_targets_are_non_root_with_httpfs_baked_in() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    stages: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("FROM "):
            current = line.split(" AS ")[-1].strip()
            stages[current] = [line]
        elif current:
            stages[current].append(line)
    assert {"base", "deps", "dagster", "project", "code", "trainer"} <= set(stages)
    assert stages["base"][0] == "FROM ${BASE_IMAGE} AS base" and "ARG BASE_IMAGE=" in text
    for target in ("dagster", "code", "trainer"):  # every image that runs ends as the non-root user
        assert [line for line in stages[target] if line.startswith("USER ")][-1] == "USER basemodel", target
    project = "\n".join(stages["project"])
    assert "INSTALL" in project and "httpfs_wheel_file" in project and "LOAD httpfs" in project
    deps = "\n".join(stages["deps"])  # torch at the lock's pin: a local CPU wheel, else TORCH_INDEX
    assert (
        "grep '^torch==' requirements-runtime.lock" in deps
        and "torch==${pin}" in deps
        and "TORCH_INDEX" in deps
    )
    assert "COPY --from=deps /opt/venv /opt/venv" in project  # build-local/ files never reach the image
    assert not any("build-local" in line for line in stages["project"] + stages["trainer"])
    compose_targets = {s["build"]["target"] for s in _compose()["services"].values() if "build" in s}
    assert compose_targets <= set(stages)


def test_the_code_server_registers_the_scenario_partitions_before_it_serves() -> None:
    """The code server's container runs `basemodel sync-partitions` on the configured file before it serves,
    so the scenarios' partitions exist in the instance while automation is stopped. The config path and the
    instance's URL (its password) come from the environment, never from argv."""
    command = _compose()["services"]["basemodel_code"]["command"]
    assert command[:2] == ["sh", "-c"]
    script = command[2]
    sync = script.index('basemodel sync-partitions "$$BASEMODEL_CONFIG"')
    assert sync < script.index("exec dagster code-server start")
    assert "PASSWORD" not in script and "POSTGRES_URL" not in script
    local = (ROOT / "deploy" / "compose.local.yml").read_text()
    assert "sync-partitions" not in local and "BASEMODEL_CODE_BIND: 127.0.0.1" in local  # same start, bound


def test_docker_compose_config_parses() -> None:
    docker = shutil.which("docker")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True) if docker else None
    if probe is None or probe.returncode != 0:
        pytest.skip(
            "the docker compose plugin is not installed here (`docker compose version` fails); "
            "test_compose_services_as_data checks the file as data"
        )
    env = {**os.environ, "POSTGRES_PASSWORD": "x"}
    proc = subprocess.run(
        [docker, "compose", "-f", str(ROOT / "docker-compose.yml"), "--profile", "gpu", "config", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- dagster dev on PostgreSQL

DAGSTER_YAML = """\
telemetry:
  enabled: false
storage:
  postgres:
    postgres_url:
      env: DAGSTER_POSTGRES_URL
run_coordinator:
  module: dagster  # the public name of the class
  class: QueuedRunCoordinator
concurrency:
  pools:
    default_limit: 1
"""

# dagster dev started from a non-interactive shell ignores SIGINT/SIGTERM unless SIGINT is reset first.
RESET_SIGINT = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"

LAUNCH = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
# launchRun's executionParams: refresh_and_train over the tiny data's days (both deployment tests launch it)
REFRESH_AND_TRAIN = {
    "selector": {
        "repositoryLocationName": "basemodel_pipeline",
        "repositoryName": "__repository__",
        "jobName": "refresh_and_train",
    },
    "executionMetadata": {
        "tags": [
            {"key": "dagster/asset_partition_range_start", "value": "2023-01-01"},
            {"key": "dagster/asset_partition_range_end", "value": "2023-04-30"},
        ]
    },
}
LOCATIONS = """
{ workspaceOrError { ... on Workspace { locationEntries { name locationOrLoadError { __typename
  ... on PythonError { message } } } } } }"""
STATUS = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
MATERIALIZED = """
query($path: [String!]!) { assetOrError(assetKey: {path: $path}) {
  ... on Asset { assetMaterializations(limit: 1) { runId } } } }"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gql(url: str, query: str, **variables: object) -> dict:
    response = requests.post(url, json={"query": query, "variables": variables}, timeout=30)
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


def launch_refresh_and_train(url: str) -> str:
    """Launch refresh_and_train over GraphQL; its run id."""
    launched = _gql(url, LAUNCH, params=REFRESH_AND_TRAIN)["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def final_status(url: str, run_id: str) -> str | None:
    """The run's status once it has ended, else None."""
    status = _gql(url, STATUS, id=run_id)["runOrError"]["status"]
    return status if status in {"SUCCESS", "FAILURE", "CANCELED"} else None


def _wait(
    predicate,
    limit_s: float,
    what: str,
    logs: Callable[[], str],
    transient: tuple[type[Exception], ...] = (requests.ConnectionError,),
    poll_s: float = 1.0,
):
    """Poll until `predicate()` returns a truthy value (a `transient` error counts as not yet); fail with the
    tail of the servers' `logs()` after `limit_s` seconds (what a quiet machine needs) times the suite's
    TIME_SCALE (conftest.patient)."""
    from conftest import patient

    limit_s = patient(limit_s)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except transient:
            value = None
        if value:
            return value
        time.sleep(poll_s)
    pytest.fail(f"{what} did not happen within {limit_s:.0f} s; server logs:\n{logs()[-6000:]}")


@pytest.mark.timeout(1800)
def test_dagster_dev_on_postgres_runs_the_job_over_graphql(
    postgres_url: str, tiny_config: Path, tmp_path: Path
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    port = _free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DAGSTER_POSTGRES_URL": postgres_url,
        "BASEMODEL_CONFIG": str(tiny_config),
        "BASEMODEL_ENV": "ci",
        "BASEMODEL_AUTOMATION": "stopped",  # only the launched run: no sensor or schedule starts others
    }
    env.pop("BASEMODEL_UPLOAD_URL", None)
    dagster = str(Path(sys.executable).parent / "dagster")
    command = [
        sys.executable,
        "-c",
        RESET_SIGINT,
        dagster,
        "dev",
        "-w",
        str(ROOT / "workspace.yaml"),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    log = tmp_path / "dagster_dev.log"

    def server_log() -> str:
        return log.read_text()

    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/graphql"
    try:
        _wait(
            lambda: requests.post(url, json={"query": "{ version }"}, timeout=5).ok,
            180,
            "GraphQL answering",
            server_log,
        )
        entries = _wait(
            lambda: [
                e
                for e in _gql(url, LOCATIONS)["workspaceOrError"]["locationEntries"]
                if e["locationOrLoadError"] is not None
            ],
            180,
            "the code location loading",
            server_log,
        )
        assert [(e["name"], e["locationOrLoadError"]["__typename"]) for e in entries] == [
            ("basemodel_pipeline", "RepositoryLocation")
        ], entries
        run_id = launch_refresh_and_train(url)
        status = _wait(
            lambda: final_status(url, run_id),
            420,
            "the run ending",
            server_log,
        )
        assert status == "SUCCESS", log.read_text()[-4000:]
        for path in (["foundation_model"], ["event_cache"], ["entity_embeddings"]):
            mats = _gql(url, MATERIALIZED, path=path)["assetOrError"]["assetMaterializations"]
            assert mats and mats[0]["runId"] == run_id, path
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"dagster dev did not stop within 60 s of SIGTERM:\n{log.read_text()[-3000:]}")
    assert code in (0, -signal.SIGTERM), f"exit code {code}:\n{log.read_text()[-3000:]}"
    # the run and its events are in PostgreSQL, not in DAGSTER_HOME
    with psycopg2.connect(dbname=postgres_url.rsplit("/", 1)[1], **PG) as conn, conn.cursor() as cur:
        cur.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
        assert cur.fetchone()[0] == "SUCCESS"


def test_images_install_the_runtime_lock_without_test_packages() -> None:
    """requirements-runtime.lock is requirements.lock's pins for the library and its connectors only."""
    check = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "runtime_lock.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements-runtime.lock").read_text().splitlines()
        if "==" in line
    )
    full = dict(
        line.split("==") for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line
    )
    for test_only in ("pytest", "pyspark", "moto", "fakesnow", "bqemulator", "ruff", "chdb", "pytest-xdist"):
        assert test_only not in pins, test_only
    for needed in (
        "torch",
        "dagster",
        "duckdb",
        "lightgbm",
        "snowflake-connector-python",
        "clickhouse-connect",
    ):
        assert pins[needed] == full[needed], needed
    assert "setuptools" in pins  # the project is installed without build isolation


def test_the_local_instance_frees_a_terminated_runs_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`basemodel demo` / `make ui`'s instance (dagster dev, the default run launcher): the daemon's run
    monitoring frees a terminated run's pool slots (the single gpu slot) and ends a CANCELING run whose worker
    died, as in the deployment."""
    from basemodel_pipeline.defs.materialize import demo_instance

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "unused"))
    instance = demo_instance(tmp_path)
    try:
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] == 10
        assert instance.run_monitoring_settings["cancel_timeout_seconds"] <= 150
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
    finally:
        instance.dispose()
