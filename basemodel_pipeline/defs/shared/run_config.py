"""Dagster run config classes derived from the library's option models (inference/options.py), so that a
scoring option is declared once: its name, default and description come from the model's field.

Dagster's config types are plain (str, int, float, bool, optional); a field of another type (a date, a path,
a shard, a choice) is text in the launchpad and parsed by the model in `to_options()`, where a wrong value
fails the step with one line naming the field.
"""

from __future__ import annotations

import types
from typing import Any, ClassVar, Union, get_args, get_origin

import dagster as dg
from pydantic import BaseModel, Field, create_model

from basemodel_pipeline.errors import UserError
from basemodel_pipeline.inference.options import EmbedOptions

PLAIN = (bool, int, float, str)


class OptionsConfig(dg.Config):
    """A run config whose fields are those of `options` (set by `run_config_class`)."""

    options: ClassVar[type[EmbedOptions]] = EmbedOptions

    def to_options(self) -> EmbedOptions:
        """The typed options; a wrong value fails the step with one line naming the field."""
        try:
            return self.options.from_values(self.model_dump())
        except UserError as err:
            raise dg.Failure(description=f"run config: {err}", allow_retries=False) from None

    def to_argv(self) -> list[str]:
        """The flags of the Pipes entrypoint for these options (the launcher's arguments)."""
        return self.to_options().to_argv()


def _plain(annotation: Any) -> tuple[Any, bool]:
    """(the Dagster-plain type of a field's annotation, whether None is allowed)."""
    args = get_args(annotation)
    optional = get_origin(annotation) in (Union, types.UnionType) and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else str
    return (annotation if annotation in PLAIN else str), optional


def run_config_class(options: type[EmbedOptions], name: str, doc: str) -> type[OptionsConfig]:
    """A dg.Config with one field per field of `options`: same name, default and description."""
    fields: dict[str, Any] = {}
    for field_name, field in options.model_fields.items():
        kind, optional = _plain(field.annotation)
        default = field.default
        if isinstance(default, BaseModel) or (default is not None and type(default) not in PLAIN):
            default = None
        fields[field_name] = (
            kind | None if optional else kind,
            Field(default, description=field.description),
        )
    cls = create_model(name, __base__=OptionsConfig, __doc__=doc, __module__=__name__, **fields)
    cls.options = options
    return cls
