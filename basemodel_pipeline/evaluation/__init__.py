"""Evaluation: metrics and the baselines every quality claim is compared to.

- ``metrics``: every metric of the five task types (AUROC/AP/log-loss, accuracy/top-k, RMSE/MAE/Spearman,
  HitRate/Precision/Recall/MAP/NDCG@K and MRR) and the primary metric per task.
- ``baselines``: LightGBM on the aggregates (features/aggregates.py), popularity scores, and for
  recommendation "repeat what they bought" and item popularity (DESIGN.md §6).
- ``probe``: the fixed MLP probe on embeddings (RecSys Challenge 2025 style).
"""
