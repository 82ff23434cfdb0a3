"""`python -m basemodel_pipeline.cli` (and `torchrun -m basemodel_pipeline.cli`): the `basemodel` command."""

from basemodel_pipeline.cli import main

if __name__ == "__main__":
    main()
