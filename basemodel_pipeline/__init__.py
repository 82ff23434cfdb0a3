"""basemodel_pipeline: behavioral foundation models and scenario models from raw event data.

The library never imports Dagster; Dagster code lives only in ``basemodel_pipeline.defs`` and
``basemodel_pipeline.definitions``.
"""

__version__ = "0.1.0"
