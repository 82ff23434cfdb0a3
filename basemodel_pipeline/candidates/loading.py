"""A published candidate back from its saved meta and files (the scoring side: inference/predict.py, and the
staged baselines: scenarios/staging.py). This module imports every candidate class of the package, so none
imports another back."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from basemodel_pipeline.candidates.bagging import SeedBag, member_files
from basemodel_pipeline.candidates.base import Candidate, Context
from basemodel_pipeline.candidates.blend import Blend
from basemodel_pipeline.candidates.lightgbm import LightGBM
from basemodel_pipeline.candidates.neural import Neural
from basemodel_pipeline.candidates.popularity import Popularity
from basemodel_pipeline.candidates.ranking_baselines import (
    Cooccurrence,
    NeuralRanking,
    RecentPopularity,
    RecommendPopularity,
    RepeatPurchases,
)
from basemodel_pipeline.candidates.rerank import FEATURES, Reranker
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.evaluation.gbm import GBM


def load_candidate(meta: dict[str, Any], files: dict[str, bytes], ctx: Context) -> Candidate:
    """A published candidate from its saved meta and files (inference/predict.py)."""
    kind = meta["kind"]
    if kind == "neural":
        return Neural(ctx)
    if kind == "popularity":
        return Popularity(ctx, meta.get("sign", 1.0), meta.get("prior"))
    if kind == "lightgbm":
        from safetensors.numpy import load

        c = LightGBM(ctx, meta["features"])
        if "fallback" in meta:
            c.fallback = Popularity(ctx, meta["fallback"].get("sign", 1.0), meta["fallback"].get("prior"))
        if f"{c.name}.json" in files:
            c.gbm = GBM.from_json(files[f"{c.name}.json"].decode())
        if "top" in meta:
            c.top = np.asarray(meta["top"], np.int64)
        if f"{c.name}_pca.safetensors" in files:
            t = load(files[f"{c.name}_pca.safetensors"])
            c.pca = (t["mean"], t["components"])
        return c
    if kind == "seed_bag":
        bag = SeedBag(ctx, lambda c: LightGBM(c, "hybrid"), meta["name"], seeds=0)
        bag.members = [
            load_candidate(m, member_files(files, i), dataclasses.replace(ctx, seed=seed))
            for i, (m, seed) in enumerate(zip(meta["members"], meta["seeds"], strict=True))
        ]
        return bag
    if kind == "blend":
        b = Blend(ctx, [load_candidate(m, files, ctx) for m in meta["members"]])
        b.weights, b.intercept = np.asarray(meta["weights"], np.float64), float(meta["intercept"])
        b.scale = float(meta.get("scale", 1.0))
        return b
    if kind in (
        "reranker",
        "repeat",
        "recommend_popularity",
        "recent_popularity",
        "cooccurrence",
        "neural_ranking",
    ):
        return load_ranking_candidate(meta, files, ctx)
    raise ValueError(f"unknown candidate kind '{kind}' in the checkpoint")


def load_ranking_candidate(meta: dict[str, Any], files: dict[str, bytes], ctx: Context):
    kind = meta["kind"]
    if kind == "reranker":
        if list(meta.get("features", FEATURES)) != list(FEATURES):
            raise UserError(
                f"scenario '{ctx.scenario.name}': its re-ranker was trained on other features than this version "
                f"computes ({len(meta.get('features', []))} vs {len(FEATURES)}); re-run `basemodel finetune "
                f"CONFIG -s {ctx.scenario.name}`"
            )
        c = Reranker(ctx)
        if "reranker.txt" in files:
            c.model = files["reranker.txt"].decode()
        c.rounds = int(meta.get("rounds", 0))
        return c
    if kind == "repeat":
        return RepeatPurchases(ctx)
    if kind == "recommend_popularity":
        return RecommendPopularity(ctx)
    if kind == "cooccurrence":
        return Cooccurrence(ctx)
    if kind == "recent_popularity":
        recent = RecentPopularity(ctx, int(meta.get("window", 7)))
        scores = meta.get("window_scores") or {}  # JSON: days as text, NaN as null
        recent.scores = {int(w): float("nan") if v is None else float(v) for w, v in scores.items()}
        return recent
    return NeuralRanking(ctx, float(meta.get("weight", 0.0)))
