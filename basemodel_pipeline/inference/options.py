"""What a scoring run is asked for, typed once: `EmbedOptions` (embeddings) and `ScoringOptions` (predictions).

Every face builds one and hands it to the library (pipeline.run_predict / run_embed, inference.predict.predict,
inference.embed.export_embeddings); nothing else carries scoring options:

    basemodel predict / embed (cli/scoring.py)   each flag is a field: `--top-k` is top_k (a test walks the commands)
    the Pipes entrypoints (entrypoints/)          `from_argv`, the one parser of these flags
    Dagster (defs/predictions/)                   a run config class derived from the fields, `to_options()`

The other way, a run launched in another process, container or Dagster step gets `to_argv()`: the fields that
differ from their defaults, spelled as those flags. `to_values()` / `from_values()` are the plain form both
directions share (dates as YYYY-MM-DD, a shard as "I/K", a path as text).

A wrong value is one line naming the field (`precision 'fp16': input should be 'auto', 'fp32', 'bf16' or
'int8'`), an ArgumentError that the CLI re-words with its flag. This module never imports dagster.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from basemodel_pipeline.errors import ArgumentError, UserError

SUBSET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
SUBSET_WITH_SHARDS = (
    "a subset is scored in one process: merged shards replace the whole table, so leave out the shard, the "
    "workers and the merge"
)
DEVICE = r"cpu|auto|cuda(:\d+)?"
AT_LEAST_ONE = {
    "top_k": "give k of at least 1",
    "merge_shards": "give the number of part files, at least 1",
    "workers": "give a number of worker processes of at least 1",
}


def flag(name: str) -> str:
    """The command-line flag of a field: top_k -> --top-k."""
    return "--" + name.replace("_", "-")


def check_shard(shard: tuple[int, int]) -> None:
    """Shard (I, K) must be one of K slices: 0 <= I < K."""
    i, k = shard
    if not (k >= 1 and 0 <= i < k):
        raise ArgumentError("shard", f"{i}/{k}", "write I/K with 0 <= I < K (e.g. 0/4 ... 3/4)")


def _shown(value: Any) -> str | None:
    if isinstance(value, dict):  # the whole input: the message names the field
        return None
    return repr(value) if isinstance(value, str) else str(value)


def _one_line(err: ValidationError, model: type[BaseModel]) -> ArgumentError:
    """The first error of a validation as one ArgumentError naming the field."""
    first = err.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else "options"
    if first["type"] == "extra_forbidden":
        known = ", ".join(model.model_fields)
        return ArgumentError(name, None, f"is not a scoring option (the options: {known})")
    if first["type"] == "value_error":
        detail = str(first["ctx"]["error"])
    else:
        detail = first["msg"][:1].lower() + first["msg"][1:]
    return ArgumentError(name, _shown(first.get("input")), detail)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, never a usage text and exit
        raise UserError(f"scoring options: {message}")


class EmbedOptions(BaseModel):
    """Options of an embeddings export (and of every scoring run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    as_of: dt.date | None = Field(
        default=None, description="As of this date, YYYY-MM-DD (default: the day after the data)."
    )
    output: str | None = Field(
        default=None,
        description="Destination name from the config's outputs section (default: Parquet in the workspace).",
    )
    precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        default="auto", description="auto | fp32 | bf16 | int8 (int8: CPU dynamic quantization)."
    )
    device: str = Field(default="cpu", description="cpu | cuda | cuda:N | auto.")
    replay: bool = Field(
        default=False, description="Recompute features from the history even as of the latest date."
    )

    @model_validator(mode="wrap")
    @classmethod
    def _one_line_errors(cls, data: Any, handler: Any) -> Any:
        try:
            return handler(data)
        except ValidationError as err:
            raise _one_line(err, cls) from None

    @field_validator("as_of", mode="before")
    @classmethod
    def _date(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return dt.date.fromisoformat(value.strip())
            except ValueError:
                raise ValueError("is not a date; write YYYY-MM-DD") from None
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not re.fullmatch(DEVICE, value):
            raise ValueError("choose cpu, cuda, cuda:N or auto")
        return value

    # ------------------------------------------------------------------ the one translation each way

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Self:
        """Options from plain values (a run config, a command's parameters): the keys that are fields, None
        meaning the default. A wrong value is one line naming the field."""
        return cls.model_validate(
            {k: v for k, v in values.items() if k in cls.model_fields and v is not None}
        )

    def to_values(self) -> dict[str, Any]:
        """The fields that differ from their defaults, as plain values (from_values reads them back)."""
        out: dict[str, Any] = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value == field.default:
                continue
            if isinstance(value, dt.date):
                value = value.isoformat()
            elif isinstance(value, tuple):
                value = "/".join(map(str, value))
            elif isinstance(value, Path):
                value = str(value)
            out[name] = value
        return out

    def to_argv(self) -> list[str]:
        """Command-line flags for the CLI or a Pipes entrypoint in another process: `from_argv` reads them back."""
        argv: list[str] = []
        for name, value in self.to_values().items():
            argv += [flag(name)] if value is True else [flag(name), str(value)]
        return argv

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per field (a parser's part of `from_argv`; the entrypoints share their parser)."""
        for name, field in cls.model_fields.items():
            if field.annotation is bool:
                parser.add_argument(flag(name), dest=name, action="store_true", help=field.description)
            else:
                parser.add_argument(flag(name), dest=name, help=field.description)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> Self:
        """The options of a namespace parsed with `add_arguments`."""
        return cls.from_values({k: v for k, v in vars(ns).items() if v is not False})

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> Self:
        """Options from command-line flags (those of `to_argv`); an unknown flag is one line."""
        parser = _Parser(prog="scoring options", add_help=False)
        cls.add_arguments(parser)
        return cls.from_namespace(parser.parse_args(list(argv)))

    @classmethod
    def describe(cls, name: str) -> str:
        """A field's help text (the CLI's option help)."""
        return cls.model_fields[name].description or ""


class ScoringOptions(EmbedOptions):
    """Options of a scenario's scoring: what to score, how to lay the run out (ScoringOptions.single), where."""

    entities: Path | None = Field(
        default=None,
        description="Score only these ids: a text file (one per line), or CSV/Parquet with an entity_id column. "
        "Written as a subset beside the full table, which stays as it is.",
    )
    subset: str | None = Field(
        default=None, description="Name of the --entities output (default: the file's name without suffix)."
    )
    top_k: int | None = Field(default=None, description="Recommendations / multilabel: k best.")
    threshold: float | None = Field(
        default=None, description="Multilabel: keep labels scoring at least this."
    )
    shard: tuple[int, int] | None = Field(
        default=None, description="I/K: score the I-th of K slices into a part file."
    )
    merge_shards: int | None = Field(default=None, description="K: write the K part files to the output.")
    workers: int = Field(default=1, description="K local processes, one shard each, then merge.")

    @field_validator("top_k", "merge_shards", "workers")
    @classmethod
    def _at_least_one(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < 1:
            raise ValueError(AT_LEAST_ONE[info.field_name or ""])
        return value

    @field_validator("threshold")
    @classmethod
    def _probability(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value <= 1:
            raise ValueError("is a probability: give a number from 0 to 1")
        return value

    @field_validator("shard", mode="before")
    @classmethod
    def _shard(cls, value: Any) -> Any:
        if isinstance(value, str):
            i, _, k = value.partition("/")
            try:
                value = int(i), int(k)
            except ValueError:
                raise ValueError("is not I/K (e.g. 0/4)") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.shard is not None:
            check_shard(self.shard)
        layouts = [n for n, on in [("workers", self.workers > 1), ("shard", self.shard), ("merge_shards", self.merge_shards)] if on]  # fmt: skip
        if len(layouts) > 1:
            raise ArgumentError(
                layouts[0],
                None,
                f"cannot be combined with {' or '.join(layouts[1:])}: choose one layout per run",
            )
        if self.entities is None and self.subset is not None:
            raise ArgumentError(
                "subset", repr(self.subset), "a subset needs the ids to score: give the entities too"
            )
        if self.entities is not None:
            if not self.single:
                raise ArgumentError("entities", None, SUBSET_WITH_SHARDS)
            if not SUBSET_NAME.fullmatch(self.subset_name or ""):
                raise ArgumentError(
                    "subset", repr(self.subset_name), "use up to 100 letters, digits, '.', '_' or '-'"
                )
        return self

    @property
    def single(self) -> bool:
        """Every entity in this one process: no workers, no shard, no merge."""
        return self.workers == 1 and self.shard is None and self.merge_shards is None

    @property
    def subset_name(self) -> str | None:
        """The subset's name: `subset`, else the ids file's name without suffix (None without entities)."""
        if self.entities is None:
            return None
        return self.subset or self.entities.stem

    def for_shard(self, i: int, k: int, as_of: dt.date) -> ScoringOptions:
        """One worker's options: shard (I, K) into its part file, as of the run's date."""
        return self.model_copy(update={"shard": (i, k), "workers": 1, "output": None, "as_of": as_of})
