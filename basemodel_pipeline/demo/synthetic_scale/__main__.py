"""``python -m basemodel_pipeline.demo.synthetic_scale``: the generator's command line (synthetic_scale/cli.py)."""

from basemodel_pipeline.demo.synthetic_scale.cli import main

if __name__ == "__main__":
    main()
