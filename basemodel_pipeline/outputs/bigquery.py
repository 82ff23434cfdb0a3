"""BigQuery: chunks are spooled to a local Parquet file (bounded memory), loaded into a staging table by one
load job at close, and one MERGE (a single atomic DML statement) deletes the (scenario, as_of) slice and
inserts the staged rows. The staging table expires after a day even if the process is killed."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from basemodel_pipeline.outputs.warehouse import TableWriter, sql_type
from basemodel_pipeline.sources.bigquery import BigQueryBackend, api_retry, query


def wide(kind: str) -> pa.DataType:
    """Arrow type staged for a column kind: BigQuery has only 64-bit floats and integers."""
    if kind.startswith("list:"):
        return pa.list_(wide(kind[5:]))
    return {"float32": pa.float64(), "float64": pa.float64(), "int": pa.int64()}.get(kind) or {
        "string": pa.string(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "bool": pa.bool_(),
    }[kind]


class BigQueryWriter(TableWriter):
    dialect = "bigquery"
    backend: BigQueryBackend
    _spool: Path | None = None
    _parquet: pq.ParquetWriter | None = None
    _loaded = False

    def execute(self, sql: str) -> None:
        query(self.backend.client, sql).result(retry=api_retry())

    def create_stage(self) -> None:
        cols = ", ".join(f"{self.q(n)} {sql_type(k, self.dialect)}" for n, k in self.kinds.items())
        self.execute(
            f"CREATE TABLE {self.sql(self.stage_table)} ({cols}) "
            "OPTIONS (expiration_timestamp = TIMESTAMP_ADD(CURRENT_TIMESTAMP(), INTERVAL 1 DAY))"
        )

    def append(self, table: pa.Table) -> None:
        schema = pa.schema([(n, wide(k)) for n, k in self.kinds.items()])
        if self._parquet is None:
            self._spool = Path(tempfile.mkdtemp(prefix="basemodel-bq-"))
            self._parquet = pq.ParquetWriter(self._spool / "rows.parquet", schema, compression="zstd")
        self._parquet.write_table(table.cast(schema))

    def load_stage(self) -> None:
        from google.cloud import bigquery

        assert self._spool is not None
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        config = bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.PARQUET,
            write_disposition=bigquery.WriteDisposition.WRITE_APPEND,
        )
        options = bigquery.ParquetOptions()
        options.enable_list_inference = True  # Parquet lists load as ARRAY columns
        config.parquet_options = options
        stage = ".".join(p.name for p in self.stage_table.parts)
        with open(self._spool / "rows.parquet", "rb") as fh:
            self.backend.client.load_table_from_file(fh, stage, job_config=config).result()

    def publish(self) -> None:
        if not self._loaded:  # once: a retried publish finds the rows already staged
            self.load_stage()
            self._loaded = True
        self.execute(self.merge_sql())

    def _close(self) -> dict:
        try:
            return super()._close()
        finally:
            self.remove_spool()

    def _abort(self) -> None:
        try:
            super()._abort()
        finally:
            self.remove_spool()

    def remove_spool(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
            self._spool = None
