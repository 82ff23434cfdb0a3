"""Type inference: what a source column's DuckDB type makes of it in the cache (categorical, numeric, list or
ignored). The cache build (cache/plan.py), the data checks (sources/data_checks.py) and the config suggestion
(sources/suggest.py) share these rules."""

from __future__ import annotations

INTEGER_PREFIXES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                    "UINTEGER", "UBIGINT")  # fmt: skip
NUMERIC_PREFIXES = (*INTEGER_PREFIXES, "FLOAT", "DOUBLE", "DECIMAL", "REAL")
FLOAT_PREFIXES = ("FLOAT", "DOUBLE", "DECIMAL", "REAL")


def is_list_type(duck_type: str) -> bool:
    """A list-valued column (a movie's genres): VARCHAR[], INTEGER[], LIST(...)."""
    t = duck_type.upper()
    return t.endswith("[]") or t.startswith("LIST")


def infer_column_type(name: str, duck_type: str, override: str | None) -> str:
    """categorical | numeric | list | ignore. Integers named like ids are categorical; floats numeric; text
    categorical; lists of values become multi-hot indicators (list_columns)."""
    if override:
        return override
    t = duck_type.upper()
    if is_list_type(t):
        return "list"
    if t.startswith(("DATE", "TIME", "INTERVAL", "BLOB", "STRUCT", "MAP", "LIST")) or t.endswith("[]"):
        return "ignore"
    if t.startswith(FLOAT_PREFIXES):
        return "numeric"
    if t.startswith(NUMERIC_PREFIXES):
        return "categorical" if name.lower().endswith("id") or name.lower().endswith("_key") else "numeric"
    return "categorical"
