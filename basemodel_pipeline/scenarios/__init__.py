"""The fine-tuning stage: a scenario's network trained from the foundation, its candidates fitted, compared and
one published with its report.

    finetune.py   fine-tune one or several scenarios: train, fit the candidates, choose, score the test
                  window once, refit, publish the checkpoint (the candidates themselves are candidates/)
    shared.py     what the scenarios of one run share: the cache, the foundation, the featurised examples,
                  each scenario's examples and splits, the data regime
    network.py    the scenario network's training loop (full, frozen or LoRA) with early stopping
    fitting.py    the other candidates fitted (beside the network's training with a frozen trunk)
    refit.py      the published candidate trained again on more windows
    baselines.py  the CPU step that fits the candidates needing no network, staged by staging.py
    targets.py    a scenario's target turned into labelled (entity, split time) examples
    outcome.py    what a fine-tuning run returns (and Dagster shows)
"""
