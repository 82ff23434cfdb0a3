"""Shared base of the config models."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_INT = (
    2**53
)  # no count, size or number of days in a config comes near it; numpy's int64 overflows at 2**63
# Strings: every one (paths, table names, where_condition, sql_lambdas, values) has at most MAX_STRING_CHARS
# characters (a 4 MB where_condition kept the SQL parser busy for minutes); names and identifiers (sources,
# scenarios, destinations, columns, aliases), which become file names and SQL identifiers, MAX_NAME_CHARS.
MAX_STRING_CHARS = 10_000
MAX_NAME_CHARS = 128

Name = Annotated[str, Field(pattern=IDENTIFIER, max_length=MAX_NAME_CHARS)]  # a name the pipeline gives
ColumnName = Annotated[str, Field(max_length=MAX_NAME_CHARS)]  # a column or a source, as the config names it


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_max_length=MAX_STRING_CHARS)

    @model_validator(mode="before")
    @classmethod
    def _sensible_integers(cls, data: Any) -> Any:
        """Integers beyond any sensible size (10**30 epochs, a 10**19-day horizon) are refused here, naming
        the field, instead of overflowing int64 later in a traceback."""
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                    raise ValueError(f"{key}: {value} is too large (at most {MAX_INT:,} in absolute value)")
        return data
