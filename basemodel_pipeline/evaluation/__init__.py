"""Evaluation: metrics and the baselines every quality claim is compared to.

- ``metrics``: every metric of the five task types (AUROC/AP/log-loss, accuracy/top-k, RMSE/MAE/Spearman,
  HitRate/Precision/Recall/MAP/NDCG@K and MRR) and the primary metric per task.
- ``baselines``: popularity scores, and for recommendation "repeat what they bought" and item popularity;
  ``gbm``: LightGBM on the aggregates (features/aggregates.py) (docs/design.md, "Evaluation protocol").
- ``probe``: the fixed MLP probe on embeddings (RecSys Challenge 2025 style).
"""
