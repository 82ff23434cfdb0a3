"""The graph's shape (which extract assets exist) comes from the config when Dagster loads the code.

If the config file does not exist yet (a fresh checkout before `make demo`), the graph takes its shape from
the demo config (transactions, products, demographics), so `dagster dev` always shows a complete graph; a
run then fails with "config file not found" until the file exists. A config that exists but is invalid is
an error at load time, shown by Dagster with the file, line and field.
"""

from __future__ import annotations

from pathlib import Path

from basemodel_pipeline.config import DataSource, load_config, parse_config
from basemodel_pipeline.demo import DEMO_CONFIG


def data_sources(config_path: str) -> list[DataSource]:
    path = Path(config_path)
    if path.is_file():
        return list(load_config(path).data_sources)
    return list(parse_config(DEMO_CONFIG, Path("demo_config.yaml")).data_sources)
