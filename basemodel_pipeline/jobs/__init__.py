"""Pipes entrypoints: ``python -m basemodel_pipeline.jobs.<stage> --config PATH [...]``.

Each module runs one pipeline stage (basemodel_pipeline.pipeline) and reports its metadata to Dagster
through dagster-pipes, or prints it when started by hand. These modules never import dagster.
"""
