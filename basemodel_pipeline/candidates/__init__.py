"""Candidates: the models a scenario compares and publishes, behind one estimator protocol (base.py).

    base.py               Context (what a scenario's candidates share) and the Candidate protocol
    inputs.py             Rows: what candidates read of (entity, time) rows (network outputs, embedding,
                          aggregates)
    neural.py             the fine-tuned network's outputs (the network itself trains in scenarios/)
    popularity.py         the rule-of-thumb baseline of classifiers and regression
    lightgbm.py           LightGBM on the aggregates, alone or with the foundation embedding
    blend.py              a weighted combination of fitted candidates
    bagging.py            a candidate fitted with several seeds, averaged (and the spread of the seeds)
    ranking_baselines.py  recommendation without a learned ranker: repeat, popularity, co-occurrence, the network
    rerank.py             the recommendation re-ranker (LightGBM LambdaRank over a candidate pool)
    item_stats.py         what the ranking candidates know of the items: own history, popularity, co-occurrence
    zoo.py                the candidates a scenario fits, per task type
    selection.py          the choice on validation windows (and the blend's fit)
    calibration.py        the published outputs' calibration (a log1p amount's map to money)
    loading.py            a saved candidate back (scoring, staged baselines)

Fine-tuning (scenarios/) fits them, chooses and publishes one; scoring (inference/) loads it. Nothing here
imports scenarios/.
"""
