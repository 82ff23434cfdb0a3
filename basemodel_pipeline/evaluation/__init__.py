"""Evaluation: metrics, hand-crafted aggregate features and the baselines every quality claim is compared to.

- ``metrics``: every metric of the five task types (AUROC/AP/log-loss, accuracy/top-k, RMSE/MAE/Spearman,
  HitRate/Precision/Recall/MAP/NDCG@K and MRR) and the primary metric per task.
- ``aggregates``: vectorised windowed counts/sums, top-value counts, recency/tenure/frequency/monetary and
  main-entity attributes per (entity, split time), computed from the event cache's CSR arrays.
- ``baselines``: LightGBM on the aggregates, popularity scores, and for recommendation "repeat what they
  bought" and item popularity (DESIGN.md §6).
- ``probe``: the fixed MLP probe on embeddings (RecSys Challenge 2025 style).
"""
