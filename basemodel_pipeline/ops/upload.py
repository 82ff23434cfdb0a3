"""Upload finished artifacts (checkpoints, reports, predictions) from the POSIX workspace to s3://.

Training and scoring write only to the local workspace; this module copies what is finished to object
storage afterwards, keeping the path relative to the workspace:

    <workspace>/checkpoints/scenarios/churn/<version>/model.safetensors
        -> s3://bucket/prefix/checkpoints/scenarios/churn/<version>/model.safetensors

Only finished artifacts are uploaded: hidden paths (``.resume/``, ``.tmp`` staging names) are never
uploaded. Each object carries its sha256 as object metadata, and a re-run skips objects whose sha256 already
matches, so uploading is idempotent and a killed upload is completed by the next run. The directory's
``_PUBLISHED.json`` (files, sizes, sha256) is written last: a reader that sees it sees a complete copy.

The client is any boto3 S3 client (dagster-aws's S3Resource gives one in Dagster; ``boto3.client("s3")``
in a notebook). Credentials come from the environment (boto3's chain), never from here. Every request is
retried on a refused, reset or timed-out connection, throttling or a 5xx (basemodel_pipeline.retry, after
boto3's own retries); what keeps failing is one DataError line naming the URL and the endpoint's host:port.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from basemodel_pipeline import manifests
from basemodel_pipeline.errors import ConfigError, DataError
from basemodel_pipeline.retry import host_port, with_retry

T = TypeVar("T")

# What readers of the bucket look for: written last, so present only once the copy is complete.
MARKER = "_PUBLISHED.json"
SHA_KEY = "sha256"


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (bucket, "some/prefix")."""
    if not url.startswith("s3://") or len(url) <= 5:
        raise ConfigError(f"upload url '{url}' is not an s3:// url; write s3://bucket/prefix")
    bucket, _, prefix = url[5:].partition("/")
    if not bucket:
        raise ConfigError(f"upload url '{url}' has no bucket; write s3://bucket/prefix")
    return bucket, prefix.strip("/")


def s3_call(client: Any, url: str, fn: Callable[[], T]) -> T:
    """One S3 request of an upload to `url`, retried on transient failures; failures are one line naming the
    URL and, for a connection that kept failing, the endpoint's host:port."""
    secrets = (os.environ.get("AWS_SECRET_ACCESS_KEY", ""), os.environ.get("AWS_SESSION_TOKEN", ""))
    endpoint = host_port(getattr(getattr(client, "meta", None), "endpoint_url", None))
    return with_retry(fn, what=f"upload to {url}", where=endpoint, secrets=secrets)


def finished_files(directory: Path) -> list[Path]:
    """Files under `directory`, skipping hidden (staging, resume) paths, sorted."""
    return sorted(
        p
        for p in directory.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )


def _remote_sha(client: Any, url: str, bucket: str, key: str) -> str | None:
    from botocore.exceptions import ClientError

    def head() -> dict[str, Any] | None:
        try:
            return client.head_object(Bucket=bucket, Key=key)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    found = s3_call(client, url, head)
    return None if found is None else found.get("Metadata", {}).get(SHA_KEY)


def upload_dir(client: Any, directory: Path, workspace: Path, url: str) -> dict[str, Any]:
    """Upload one finished artifact directory (or file) under `workspace` to `url`; returns what was done."""
    directory, workspace = Path(directory).resolve(), Path(workspace).resolve()
    if not directory.exists():
        raise DataError(f"cannot upload {directory}: it does not exist; materialize it first")
    if not directory.is_relative_to(workspace):
        raise DataError(f"cannot upload {directory}: it is outside the workspace {workspace}")
    bucket, prefix = parse_s3_url(url)
    files = [directory] if directory.is_file() else finished_files(directory)
    if not files:
        raise DataError(f"cannot upload {directory}: it holds no finished files")
    manifest: dict[str, dict[str, Any]] = {}
    uploaded = skipped = 0
    for path in files:
        rel = path.relative_to(workspace).as_posix()
        key = f"{prefix}/{rel}" if prefix else rel
        sha = manifests.sha256_file(path)
        manifest[rel] = {"bytes": path.stat().st_size, SHA_KEY: sha}
        if _remote_sha(client, url, bucket, key) == sha:
            skipped += 1
            continue
        extra = {"Metadata": {SHA_KEY: sha}}
        s3_call(client, url, lambda: client.upload_file(str(path), bucket, key, ExtraArgs=extra))  # noqa: B023
        uploaded += 1
    rel_dir = directory.relative_to(workspace).as_posix()
    marker_rel = f"{rel_dir}/{MARKER}" if directory.is_dir() else f"{rel_dir}.{MARKER}"
    marker_key = f"{prefix}/{marker_rel}" if prefix else marker_rel
    body = json.dumps({"files": manifest}, indent=2, sort_keys=True).encode()
    s3_call(
        client,
        url,
        lambda: client.put_object(Bucket=bucket, Key=marker_key, Body=body, ContentType="application/json"),
    )
    return {
        "url": f"s3://{bucket}/{marker_key.rsplit('/', 1)[0]}" if "/" in marker_key else f"s3://{bucket}",
        "files": len(files),
        "bytes": sum(f["bytes"] for f in manifest.values()),
        "uploaded": uploaded,
        "skipped": skipped,
    }


def uploaded_manifest(client: Any, url: str, rel_dir: str) -> dict[str, Any] | None:
    """The ``_PUBLISHED.json`` of an uploaded directory, or None when it is not (completely) uploaded."""
    from botocore.exceptions import ClientError

    bucket, prefix = parse_s3_url(url)
    key = "/".join(p for p in (prefix, rel_dir.strip("/"), MARKER) if p)
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError:
        return None
    return json.loads(body)
