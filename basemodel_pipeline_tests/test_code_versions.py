"""Each asset's code version (defs/shared/versions.py) covers every module its stage runs: the import closure of the
stage's entry module, lazy imports included (test_architecture's import graph). A module missing from it
could change what the stage writes without marking the asset stale."""

from __future__ import annotations

from basemodel_pipeline.defs.shared.versions import DEPENDS_ON
from basemodel_pipeline_tests.test_architecture import ROOT, graph, layer_of, modules, reachable

ENTRY = {  # the module each asset's stage starts from (pipeline.py calls it)
    "extract": "sources.extract",
    "event_cache": "cache.build",
    "foundation_model": "training.pretrain",
    "scenario_baselines": "scenarios.baselines",
    "scenario_model": "scenarios.finetune",
    "predictions": "inference.predict",
    "entity_embeddings": "inference.embed",
    "uploaded_artifacts": "ops.upload",
    "workspace_retention": "ops.retention",
}
NO_CONTENT = {
    "",
    "progress",
    "errors",
    "diskfaults",
    "metadata",
    "settings",
    "retry",
    "stops",
    "locks",
}  # messages, faults, env names, retries, signals, locks between processes


def covered(asset: str, module: str) -> bool:
    path = modules()[module].relative_to(ROOT).as_posix()
    return any(path == part or path.startswith(part + "/") for part in DEPENDS_ON[asset])


def test_every_stage_module_is_in_its_assets_code_version() -> None:
    assert set(ENTRY) <= set(DEPENDS_ON)
    missing = {
        asset: sorted(m for m in ({entry} | reachable(graph(), entry)) - NO_CONTENT if not covered(asset, m))
        for asset, entry in ENTRY.items()
    }
    assert not {a: m for a, m in missing.items() if m}, missing


# Packages the baselines step imports whose content reaches a stage through another part of its key
KEYED_ELSEWHERE = {
    "sources": "the extracts make the cache, whose data_version the key holds",
    "model": "the baselines read no network; the foundation's feature encoder is in the key",
}


def test_the_staged_baselines_key_covers_the_packages_they_run() -> None:
    """A staged baseline is read instead of fitted while its key holds (scenarios/staging.py): the key's code
    version hashes every package above the ground floor that the baselines step runs (the candidates
    included), but those KEYED_ELSEWHERE."""
    from basemodel_pipeline.scenarios import staging

    closure = {"scenarios.baselines"} | reachable(graph(), "scenarios.baselines")
    packages = {m.split(".")[0] for m in closure if layer_of(m) > 0}
    assert packages - set(KEYED_ELSEWHERE) <= set(staging.CODE), sorted(packages - set(staging.CODE))
    assert not set(KEYED_ELSEWHERE) & set(staging.CODE)
