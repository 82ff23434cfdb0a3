"""ClickHouse: a MergeTree table partitioned by (scenario, as_of); the slice is swapped in one step with
ALTER TABLE ... REPLACE PARTITION ... FROM <staging table> (atomic in ClickHouse); rows travel as Arrow
(clickhouse-connect insert_arrow)."""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp

from basemodel_pipeline.outputs.warehouse import AS_OF, ENTITY_ID, SCENARIO, WRITTEN_AT, TableWriter, sql_type
from basemodel_pipeline.sources.clickhouse import ClickHouseBackend


class ClickHouseWriter(TableWriter):
    dialect = "clickhouse"
    backend: ClickHouseBackend

    def create_table_sql(self) -> str:
        cols = []
        for name, kind in self.kinds.items():
            ch = self.ch_type(name, kind)
            cols.append(f"{self.q(name)} {ch}")
        order = self.q(ENTITY_ID) if ENTITY_ID in self.kinds else "tuple()"
        return (
            f"CREATE TABLE IF NOT EXISTS {self.sql(self.target)} ({', '.join(cols)}) ENGINE = MergeTree "
            f"PARTITION BY (ifNull({self.q(SCENARIO)}, ''), {self.q(AS_OF)}) ORDER BY {order}"
        )

    def ch_type(self, name: str, kind: str) -> str:
        base = sql_type(kind, self.dialect)
        if name in (ENTITY_ID, AS_OF, WRITTEN_AT) or kind.startswith("list:"):
            return base  # sorting and partition keys, always set; arrays cannot be Nullable
        return f"Nullable({base})"

    def execute(self, sql: str) -> None:
        self.backend.client.command(sql)

    def create_stage(self) -> None:
        # same structure and partitioning as the target: REPLACE PARTITION requires it
        self.execute(f"CREATE TABLE {self.sql(self.stage_table)} AS {self.sql(self.target)}")

    def append(self, table: pa.Table) -> None:
        self.backend.client.insert_arrow(self.sql(self.stage_table), table)

    def partition(self) -> str:
        scenario = exp.Literal.string(self.scenario or "").sql(dialect=self.dialect)
        return f"tuple({scenario}, toDate32('{self.as_of.isoformat()}'))"

    def publish(self) -> None:
        self.execute(
            f"ALTER TABLE {self.sql(self.target)} REPLACE PARTITION {self.partition()} "
            f"FROM {self.sql(self.stage_table)}"
        )

    def clear_slice(self) -> None:
        self.execute(f"ALTER TABLE {self.sql(self.target)} DROP PARTITION {self.partition()}")
