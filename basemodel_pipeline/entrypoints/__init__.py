"""Pipes entrypoints: ``python -m basemodel_pipeline.entrypoints.<stage> --config PATH [...]``.

Each module runs one pipeline stage (basemodel_pipeline.pipeline) and reports its metadata to Dagster
through dagster-pipes, or prints it when started by hand. These modules never import dagster. (Named
entrypoints, not jobs: a Dagster job is a selection of assets, defined in defs/.)
"""
