"""One dynamic partition per scenario in the config (added by the demo, the CLI or the sync sensor)."""

from __future__ import annotations

import dagster as dg

scenarios_partitions = dg.DynamicPartitionsDefinition(name="scenarios")
