"""One dynamic partition per scenario in the config. They are kept equal to the config's scenarios by
`sync_scenario_partitions`: at the start of `basemodel demo`, by `basemodel sync-partitions CONFIG` (which
`make ui` runs before the UI starts, and a deployment runs after each config change), and by the
scenario_registry_sensor while automation runs; so a launch from the UI finds its partition whether or not
the sensors run."""

from __future__ import annotations

import dagster as dg

scenarios_partitions = dg.DynamicPartitionsDefinition(name="scenarios")


def sync_scenario_partitions(
    instance: dg.DagsterInstance, scenarios: list[str]
) -> tuple[list[str], list[str]]:
    """Add a partition for each scenario the instance lacks and delete those no longer in `scenarios` (their
    history stays and comes back with the scenario). Returns (added, removed)."""
    existing = instance.get_dynamic_partitions(scenarios_partitions.name)
    added = [name for name in scenarios if name not in existing]
    removed = [name for name in existing if name not in scenarios]
    if added:
        instance.add_dynamic_partitions(scenarios_partitions.name, added)
    for name in removed:
        instance.delete_dynamic_partition(scenarios_partitions.name, name)
    return added, removed
