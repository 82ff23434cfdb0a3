"""Seed ensembles: one candidate fitted with several seeds, its outputs averaged.

On small data a model's test metric moves with its seed as much as the gaps between candidates (which rows
LightGBM's bagging and feature sampling draw, which entities the network's batches hold). Where the data
regime is small (scenarios/shared.py ``data_regime``; candidates/zoo.py) the scenario also fits ``lightgbm_hybrid_seeds``:
``lightgbm_hybrid`` with BAG_SEEDS seeds (the scenario's seed, then seed + 1, ...), probabilities or values
averaged. It is one more candidate: selection publishes it only when it wins on the validation windows, like
any other. ``seed_spread`` reports what the seeds did: each member's metric on the validation (select) and
test rows and their spread, in metrics.json and the report, so that a difference smaller than the spread is
read as one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from basemodel_pipeline.candidates.base import Candidate, Context, description
from basemodel_pipeline.candidates.inputs import Rows
from basemodel_pipeline.candidates.selection import primary

BAG_SEEDS = 5  # members of a seed ensemble


class SeedBag:
    """`make(ctx)` fitted once per seed; predict() is the members' mean output."""

    kind = "seed_bag"

    def __init__(
        self, ctx: Context, make: Callable[[Context], Candidate], name: str, seeds: int = BAG_SEEDS
    ) -> None:
        self.ctx, self.make, self.name = ctx, make, name
        self.members = [make(dataclasses.replace(ctx, seed=ctx.seed + i)) for i in range(seeds)]

    @property
    def seeds(self) -> list[int]:
        return [m.ctx.seed for m in self.members]  # type: ignore[attr-defined]

    def fit(self, train: Rows, stop: Rows) -> None:
        for i, m in enumerate(self.members):
            self.ctx.progress.log(f"{self.ctx.scenario.name} {self.name}: seed {i + 1}/{len(self.members)}")
            m.fit(train, stop)

    def predict(self, rows: Rows) -> np.ndarray:
        return np.mean([np.asarray(m.predict(rows), np.float64) for m in self.members], axis=0)

    def refit(self, rows: Rows) -> None:
        for m in self.members:
            m.refit(rows)

    def save(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        metas, files = [], {}
        for i, m in enumerate(self.members):
            meta, f = m.save()
            metas.append(meta)
            files.update({f"seed{i}.{k}": v for k, v in f.items()})
        return {"kind": self.kind, "name": self.name, "seeds": self.seeds, "members": metas}, files

    def describe(self) -> dict[str, Any]:
        members = [m.describe() for m in self.members]
        like = members[0] if members else {"name": "", "inputs": []}
        text = f"{like['name']} fitted with {len(members)} seeds, their outputs averaged"
        params = {"seeds": self.seeds, "members": [m["parameters"] for m in members]}
        return description(self.name, text, like["inputs"], **params)


def member_files(files: dict[str, bytes], i: int) -> dict[str, bytes]:
    """The files member `i` of a saved SeedBag wrote, under their own names."""
    prefix = f"seed{i}."
    return {k[len(prefix) :]: v for k, v in files.items() if k.startswith(prefix)}


def seed_spread(candidates: dict[str, Candidate], rows: dict[str, Rows]) -> dict[str, Any]:
    """Per seed ensemble: its seeds, each member's primary metric on the validation (select) and test rows,
    their mean, standard deviation and range, and the ensemble's own metric."""
    out: dict[str, Any] = {}
    for name, cand in candidates.items():
        if not isinstance(cand, SeedBag):
            continue
        entry: dict[str, Any] = {"seeds": cand.seeds}
        for part in ("select", "test"):
            r = rows[part]
            if len(r) == 0 or r.labels is None:
                continue
            task = cand.ctx.task
            vals = [primary(task, r.labels, m.predict(r)) for m in cand.members]
            finite = [v for v in vals if np.isfinite(v)]
            entry[part] = {
                "members": [round(v, 6) for v in vals],
                "mean": float(np.mean(finite)) if finite else float("nan"),
                "std": float(np.std(finite, ddof=1)) if len(finite) > 1 else float("nan"),
                "range": float(np.ptp(finite)) if finite else float("nan"),
                "ensemble": primary(task, r.labels, cand.predict(r)),
            }
        out[name] = entry
    return out
