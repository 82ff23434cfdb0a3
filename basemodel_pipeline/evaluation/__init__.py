"""Evaluation: metrics, hand-crafted aggregate features and the baselines every quality claim is compared to.

- ``metrics``: AUROC (binary, macro/micro multilabel), average precision, log-loss, the primary metric per task.
- ``aggregates``: vectorised windowed counts/sums, top-value counts, recency/tenure/frequency/monetary and
  main-entity attributes per (entity, split time), computed from the event cache's CSR arrays.
- ``baselines``: LightGBM on the aggregates and popularity scores (DESIGN.md §6).
"""
