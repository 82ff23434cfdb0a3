"""Databricks (Delta tables): rows go to a staging table as multi-row INSERT ... VALUES statements (literals
rendered by sqlglot in Databricks SQL, at most MAX_STATEMENT_BYTES each); one MERGE then deletes the
(scenario, as_of) slice and inserts the staged rows (a single Delta commit: atomic; needs WHEN NOT MATCHED BY
SOURCE, Databricks Runtime 12.2 LTS or later / any SQL warehouse)."""

from __future__ import annotations

import pyarrow as pa

from basemodel_pipeline.outputs.warehouse import TableWriter, render_literals
from basemodel_pipeline.sources.databricks import DatabricksBackend

MAX_STATEMENT_BYTES = 4 << 20


class DatabricksWriter(TableWriter):
    dialect = "databricks"
    backend: DatabricksBackend

    def execute(self, sql: str) -> None:
        cursor = self.backend.con.cursor()
        try:
            cursor.execute(sql)
        finally:
            cursor.close()

    def append(self, table: pa.Table) -> None:
        names = ", ".join(self.q(c) for c in self.columns)
        head = f"INSERT INTO {self.sql(self.stage_table)} ({names}) VALUES "
        columns = [
            render_literals(table.column(i), k, self.dialect) for i, k in enumerate(self.kinds.values())
        ]
        rows: list[str] = []
        size = len(head)
        for values in zip(*columns, strict=True):
            row = f"({', '.join(values)})"
            if rows and size + len(row) + 2 > MAX_STATEMENT_BYTES:
                self.execute(head + ", ".join(rows))
                rows, size = [], len(head)
            rows.append(row)
            size += len(row) + 2
        if rows:
            self.execute(head + ", ".join(rows))

    def publish(self) -> None:
        self.execute(self.merge_sql())
