"""Settings from the environment: an empty value is the default (deployments define every setting)."""

import pytest

from basemodel_pipeline.defs.shared.resources import launcher_from_env, quality_gates_from_env
from basemodel_pipeline.settings import setting, setting_list


def test_empty_means_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BASEMODEL_X", "")
    assert setting("BASEMODEL_X", "d") == "d"
    monkeypatch.setenv("BASEMODEL_X", "  ")
    assert setting("BASEMODEL_X", "d") == "d"
    monkeypatch.setenv("BASEMODEL_X", " 3 ")
    assert setting("BASEMODEL_X", "d") == "3"
    monkeypatch.delenv("BASEMODEL_X")
    assert setting("BASEMODEL_X", "d") == "d" and setting_list("BASEMODEL_X") == []
    monkeypatch.setenv("BASEMODEL_X", "a, ,b")
    assert setting_list("BASEMODEL_X") == ["a", "b"]


def test_resources_from_an_environment_with_every_setting_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """What docker-compose.yml gives a run worker when nothing is configured: `NAME=` for each setting."""
    for name in (
        "BASEMODEL_LAUNCHER",
        "BASEMODEL_GPUS",
        "BASEMODEL_NPROC",
        "BASEMODEL_TRAINER_IMAGE",
        "BASEMODEL_FORWARD_ENV",
        "BASEMODEL_CONTAINER_USER",
        "BASEMODEL_METRIC_FLOOR",
        "BASEMODEL_POPULARITY_MARGIN",
        "BASEMODEL_K8S_NAMESPACE",
    ):
        monkeypatch.setenv(name, "")
    launcher = launcher_from_env("prod")
    assert launcher.backend == "subprocess" and launcher.gpus == 0 and launcher.nproc == 0
    assert launcher.image == "basemodel-trainer:latest" and launcher.forward_env == []
    assert launcher.k8s_namespace == "default"
    gates = quality_gates_from_env("prod")
    assert gates.metric_floor is None and gates.popularity_margin is None  # the config's quality_gates decide
