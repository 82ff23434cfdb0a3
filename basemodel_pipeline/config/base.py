"""Shared base of the config models."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
