"""Config versions of the models: which part of the config decides each model's content.

The scenario registry sensor compares them between ticks: an edited scenario (its target, task, horizon,
fine-tuning options) or edited split dates retrain that scenario; edited foundation parameters retrain the
foundation (and, through the automation, the scenarios after it). Comments, outputs and cache settings
change nothing.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from basemodel_pipeline.config.models import PipelineConfig

FOUNDATION = "foundation"


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_config_versions(cfg: PipelineConfig) -> dict[str, str]:
    """{"foundation": hash, <scenario name>: hash} of the config parts each model is trained from."""
    dates = cfg.data_params.model_dump(mode="json")
    out = {FOUNDATION: _digest([dates, cfg.training_params.foundation.model_dump(mode="json")])}
    finetune = cfg.training_params.finetune.model_dump(mode="json")
    for sc in cfg.scenarios:
        out[sc.name] = _digest([dates, finetune, sc.model_dump(mode="json", exclude={"retrain"})])
    return out
