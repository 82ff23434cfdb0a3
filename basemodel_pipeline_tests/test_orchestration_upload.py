"""Uploading finished artifacts to s3:// against moto's S3 server on 127.0.0.1 (a real HTTP S3 API)."""

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import boto3
import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource
from moto.server import ThreadedMotoServer

from basemodel_pipeline.defs import upload
from basemodel_pipeline.defs.extracts.sensors import s3_listing
from basemodel_pipeline.defs.shared.deployment import deployment
from basemodel_pipeline.defs.shared.partitions import scenarios_partitions
from basemodel_pipeline.defs.shared.resources import ArtifactUploader, BasemodelConfigResource
from basemodel_pipeline.defs.upload.assets import uploaded_artifacts
from basemodel_pipeline.errors import ConfigError, DataError
from basemodel_pipeline.ops.upload import MARKER, parse_s3_url, upload_dir, uploaded_manifest


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = request.node.name.replace("_", "-")[:60].strip("-")
    client.create_bucket(Bucket=bucket)
    return client, bucket


def _workspace(tmp_path: Path) -> Path:
    return _with_checkpoint(tmp_path / "ws")


def _with_checkpoint(ws: Path) -> Path:
    """A finished scenario checkpoint in `ws`, beside a staging file and a resume state (never uploaded)."""
    ckpt = ws / "checkpoints" / "scenarios" / "churn" / "v1"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 1000)
    (ckpt / "model.json").write_text('{"kind": "scenario"}')
    (ckpt / "metrics.json").write_text('{"metric": "auroc"}')
    (ckpt / ".tmp-upload").write_text("staging, never uploaded")
    resume = ckpt / ".resume"
    resume.mkdir()
    (resume / "state.json").write_text("{}")
    return ws


def test_upload_dir_is_complete_idempotent_and_skips_unfinished(s3, tmp_path: Path) -> None:
    client, bucket = s3
    ws = _workspace(tmp_path)
    ckpt = ws / "checkpoints" / "scenarios" / "churn" / "v1"
    url = f"s3://{bucket}/models"
    first = upload_dir(client, ckpt, ws, url)
    assert (first["files"], first["uploaded"], first["skipped"]) == (3, 3, 0)
    assert first["url"] == f"s3://{bucket}/models/checkpoints/scenarios/churn/v1"
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    prefix = "models/checkpoints/scenarios/churn/v1/"
    assert keys == {prefix + n for n in ("model.safetensors", "model.json", "metrics.json", MARKER)}
    body = client.get_object(Bucket=bucket, Key=prefix + "model.safetensors")["Body"].read()
    assert body == b"\x00" * 1000
    manifest = uploaded_manifest(client, url, "checkpoints/scenarios/churn/v1")
    assert manifest["files"]["checkpoints/scenarios/churn/v1/model.safetensors"]["bytes"] == 1000

    again = upload_dir(client, ckpt, ws, url)
    assert (again["uploaded"], again["skipped"]) == (0, 3)  # same sha256: nothing uploaded twice
    (ckpt / "metrics.json").write_text('{"metric": "auroc", "v": 2}')
    assert upload_dir(client, ckpt, ws, url)["uploaded"] == 1


def test_upload_errors_name_what_to_do(s3, tmp_path: Path) -> None:
    client, bucket = s3
    ws = _workspace(tmp_path)
    with pytest.raises(ConfigError, match="'gs://b/x' is not an s3:// url"):
        parse_s3_url("gs://b/x")
    with pytest.raises(DataError, match="does not exist; materialize it first"):
        upload_dir(client, ws / "predictions" / "churn", ws, f"s3://{bucket}")
    with pytest.raises(DataError, match="outside the workspace"):
        upload_dir(client, tmp_path, ws, f"s3://{bucket}")
    assert uploaded_manifest(client, f"s3://{bucket}", "never/uploaded") is None


def test_uploaded_artifacts_asset_through_dagster_aws(s3, endpoint: str, tiny_config: Path) -> None:
    client, bucket = s3
    ws = _with_checkpoint(tiny_config.parent)  # the tiny config's workspace is its own directory
    foundation = ws / "checkpoints" / "foundation" / "f1"
    foundation.mkdir(parents=True)
    (foundation / "model.safetensors").write_bytes(b"\x01" * 10)
    preds = ws / "predictions" / "churn" / "2023-05-01"
    preds.mkdir(parents=True)
    (preds / "predictions.parquet").write_bytes(b"PAR1")

    @dg.asset(key="foundation_model")
    def foundation_model() -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"path": dg.MetadataValue.path(str(foundation))})

    @dg.asset(key="scenario_model", partitions_def=scenarios_partitions, deps=[foundation_model])
    def scenario_model() -> dg.MaterializeResult:
        return dg.MaterializeResult(
            metadata={"path": dg.MetadataValue.path(str(ws / "checkpoints/scenarios/churn/v1"))}
        )

    @dg.asset(key="predictions", partitions_def=scenarios_partitions, deps=[scenario_model])
    def predictions() -> dg.MaterializeResult:
        return dg.MaterializeResult(
            metadata={"path": dg.MetadataValue.path(str(preds / "predictions.parquet"))}
        )

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("scenarios", ["churn"])
        result = dg.materialize(
            [foundation_model, scenario_model, predictions, uploaded_artifacts],
            instance=instance,
            partition_key="churn",
            selection=[
                dg.AssetKey("foundation_model"),
                dg.AssetKey("scenario_model"),
                dg.AssetKey("predictions"),
                uploaded_artifacts.key,
            ],
            resources={
                "basemodel_config": BasemodelConfigResource(config_path=str(tiny_config)),
                "uploader": ArtifactUploader(
                    url=f"s3://{bucket}/prod", s3=S3Resource(endpoint_url=endpoint, region_name="us-east-1")
                ),
            },
        )
    assert result.success
    (mat,) = result.asset_materializations_for_node("uploaded_artifacts")
    assert mat.metadata["predictions.files"].value == 1 and mat.metadata["scenario.uploaded"].value == 3
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert "prod/predictions/churn/2023-05-01/predictions.parquet" in keys
    assert "prod/checkpoints/foundation/f1/model.safetensors" in keys
    assert f"prod/checkpoints/scenarios/churn/v1/{MARKER}" in keys
    assert not any(".resume" in k or ".tmp" in k for k in keys)


def test_s3_prefix_listing_for_the_new_data_sensor(s3) -> None:
    client, bucket = s3
    url = f"s3://{bucket}/events/*.parquet"
    empty_signature, newest = s3_listing(url, client)
    assert newest is None
    client.put_object(Bucket=bucket, Key="events/2024-03-01.parquet", Body=b"a")
    client.put_object(Bucket=bucket, Key="events/day=2024-03-02/part-0.parquet", Body=b"b")
    client.put_object(Bucket=bucket, Key="other/2030-01-01.parquet", Body=b"c")  # outside the prefix
    signature, newest = s3_listing(url, client)
    assert newest is not None and newest.isoformat() == "2024-03-02" and signature != empty_signature
    assert s3_listing(url, client) == (signature, newest)  # unchanged listing, same signature
    client.put_object(Bucket=bucket, Key="events/2024-03-01.parquet", Body=b"rewritten")
    assert s3_listing(url, client)[0] != signature  # a rewritten day is a change too
    assert json.dumps(signature)  # fits the sensor's JSON cursor


def test_the_upload_url_turns_uploading_on(tiny_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_UPLOAD_URL", "s3://artifacts/prod")
    on = deployment(str(tiny_config), "ci")
    assert on.uploading and on.resources["uploader"].url == "s3://artifacts/prod"
    assert list(upload.defs(on).assets or []) == [uploaded_artifacts]
    monkeypatch.delenv("BASEMODEL_UPLOAD_URL")
    assert not deployment(str(tiny_config), "ci").uploading
