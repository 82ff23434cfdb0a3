"""BigQuery through google-cloud-bigquery: the query runs as a job; its result streams as Arrow record
batches through the BigQuery Storage Read API (falling back to the REST pages when the Storage API is
disabled, not permitted for the result table, or not offered by an emulator)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.cloud import bigquery
from sqlglot import exp

from basemodel_pipeline.config.models import DataSource
from basemodel_pipeline.config.sources import BigQueryLocation, BigQueryParams
from basemodel_pipeline.retry import host_port
from basemodel_pipeline.settings import setting
from basemodel_pipeline.sources.base import Backend
from basemodel_pipeline.sources.sql import table_from_name

log = logging.getLogger(__name__)
PAGE_ROWS = 100_000
TRANSIENT = (
    gexc.ServiceUnavailable,
    gexc.InternalServerError,
    gexc.TooManyRequests,
    gexc.GatewayTimeout,
    gexc.DeadlineExceeded,
    gexc.RetryError,
)
STORAGE_UNAVAILABLE = (gexc.NotFound, gexc.PermissionDenied, gexc.Forbidden, gexc.MethodNotImplemented)


def call_retry_s() -> float:
    """How long the Google client itself retries one API call: its defaults (600 s for the call, 600 s more
    for inserting the job) kept a refused connection busy for over ten minutes before our retry (with_retry: backoff, then
    one line) ever saw it. BASEMODEL_BIGQUERY_CALL_RETRY_S, default 30 s."""
    return float(setting("BASEMODEL_BIGQUERY_CALL_RETRY_S", "30"))


def api_retry() -> Any:
    """The client's retry of one API call, bounded by call_retry_s."""
    from google.cloud.bigquery.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_timeout(call_retry_s())


def query(client: Any, sql: str) -> Any:
    """client.query with the API call's retry bounded and without the client's job retry (its insert retry
    runs ten minutes whatever it is given): a failed job is retried by with_retry, with its backoff."""
    return client.query(sql, retry=api_retry(), job_retry=None)


def credentials(p: BigQueryParams) -> Any:
    if p.credentials_path:
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_file(p.credentials_path)
    if p.api_endpoint:  # emulator: no Google account involved
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    return None  # application default credentials


def storage_client(p: BigQueryParams, creds: Any) -> Any:
    from google.cloud import bigquery_storage

    if p.storage_api_endpoint:
        import grpc
        from google.cloud.bigquery_storage_v1.services.big_query_read.transports import (
            BigQueryReadGrpcTransport,
        )

        channel = grpc.insecure_channel(p.storage_api_endpoint)
        return bigquery_storage.BigQueryReadClient(transport=BigQueryReadGrpcTransport(channel=channel))
    return bigquery_storage.BigQueryReadClient(credentials=creds)


class BigQueryBackend(Backend):
    dialect = "bigquery"
    transient_types = (ConnectionError, TimeoutError, *TRANSIENT)

    def __init__(self, src: DataSource, workspace: Path) -> None:
        super().__init__(src, workspace)
        self.location: BigQueryLocation = src.data_location  # type: ignore[assignment]
        p = self.location.connection_params
        creds = credentials(p)
        options = ClientOptions(api_endpoint=p.api_endpoint) if p.api_endpoint else None
        self.client = bigquery.Client(
            project=p.billing_project_id or p.project_id,
            credentials=creds,
            location=p.location,
            client_options=options,
        )
        self.storage = storage_client(p, creds) if p.storage_api else None

    def table(self) -> exp.Expression:
        p = self.location.connection_params
        table = table_from_name(self.location.table_name, self.dialect)
        if not table.db:
            table.set("db", exp.to_identifier(p.dataset_id, quoted=True))
        if not table.catalog:
            table.set("catalog", exp.to_identifier(p.project_id, quoted=True))
        return table

    def execute(self, sql: str) -> pa.RecordBatchReader:
        job = query(self.client, sql)
        rows = job.result(page_size=PAGE_ROWS, retry=api_retry())
        batches: Iterator[pa.RecordBatch] | None = None
        first = None
        if self.storage is not None:
            batches = iter(rows.to_arrow_iterable(bqstorage_client=self.storage))
            try:
                first = next(batches, None)
            except STORAGE_UNAVAILABLE as exc:
                log.warning(
                    "BigQuery Storage Read API unavailable for this result (%s); reading REST pages",
                    type(exc).__name__,
                )
                batches = None
        if batches is None:
            rows = job.result(page_size=PAGE_ROWS, retry=api_retry())
            batches = iter(rows.to_arrow_iterable(bqstorage_client=None))
            first = next(batches, None)
        if first is None:
            schema = job.result(retry=api_retry()).to_arrow(create_bqstorage_client=False).schema
            return pa.RecordBatchReader.from_batches(schema, iter(()))

        def all_batches() -> Iterator[pa.RecordBatch]:
            yield first
            yield from batches

        return pa.RecordBatchReader.from_batches(first.schema, all_batches())

    @classmethod
    def endpoint(cls, location: BigQueryLocation) -> str | None:
        return host_port(location.connection_params.api_endpoint) or "bigquery.googleapis.com:443"

    @classmethod
    def is_transient(cls, exc: BaseException) -> bool:
        if isinstance(exc, gexc.Forbidden):
            return "rateLimitExceeded" in str(exc) or "quotaExceeded" in str(exc)
        if isinstance(exc, gexc.ClientError):
            return False
        return super().is_transient(exc)

    def close(self) -> None:
        self.client.close()
