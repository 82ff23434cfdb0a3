"""The command line of the synthetic_scale generator (run by ``python -m basemodel_pipeline.demo.synthetic_scale``):

    python -m basemodel_pipeline.demo.synthetic_scale --out DIR --customers 500000 --events 50000000

Progress goes to stderr, one line per block; the summary of generate_dataset to stdout as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from basemodel_pipeline.demo.synthetic_scale.dataset import generate_dataset

DESCRIPTION = "A scalable synthetic retail dataset (50M+ events) streamed to Parquet with bounded memory."


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m basemodel_pipeline.demo.synthetic_scale", description=DESCRIPTION
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--customers", required=True, type=int)
    parser.add_argument("--events", required=True, type=int, help="approximate number of events")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--products", type=int, default=20_000)
    parser.add_argument("--rows-per-file", type=int, default=2_000_000)
    args = parser.parse_args(argv)

    def report(done: int, total: int, events: int) -> None:
        print(f"{done}/{total} customers, {events} events", file=sys.stderr)

    result = generate_dataset(
        args.out, args.customers, args.events, n_products=args.products, days=args.days, seed=args.seed,
        rows_per_file=args.rows_per_file, progress=report,
    )  # fmt: skip
    print(json.dumps(result))
