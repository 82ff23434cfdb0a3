"""Throughput of the file writers (basemodel_pipeline.outputs): binary predictions (entity_id, as_of, score)
streamed in chunks to Parquet, CSV and TSV in a scratch workspace. Writes bench/results/outputs_files.json.

    python bench/bench_outputs.py [--rows 5000000] [--chunk 65536]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from basemodel_pipeline.config import load_config
from basemodel_pipeline.demo.synthetic import write_tiny_dataset
from basemodel_pipeline.outputs import open_writer, write_table

RESULTS = Path(__file__).parent / "results"
AS_OF = dt.date(2024, 3, 1)


def chunks(rows: int, chunk: int):  # noqa: ANN201 - generator of pyarrow tables
    rng = np.random.default_rng(0)
    for a in range(0, rows, chunk):
        n = min(chunk, rows - a)
        yield pa.table(
            {
                "entity_id": np.arange(a, a + n, dtype=np.int64),
                "as_of": pa.array(np.full(n, np.datetime64(AS_OF, "D"))),
                "score": rng.random(n, dtype=np.float32),
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--chunk", type=int, default=65_536)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench_outputs_"))
    try:
        cfg = load_config(write_tiny_dataset(scratch))
        result: dict[str, object] = {
            "benchmark": "outputs_files",
            "dataset": f"{args.rows} binary predictions (entity_id int64, as_of, score float32)",
            "machine": f"{platform.machine()} {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
            "command": " ".join(["python bench/bench_outputs.py", *sys.argv[1:]]),
            "rows": args.rows,
            "chunk_rows": args.chunk,
        }
        for fmt in ("parquet", "csv", "tsv"):
            started = time.perf_counter()
            info = write_table(
                open_writer(cfg, "predictions", "churn", AS_OF, fmt), chunks(args.rows, args.chunk)
            )
            wall = time.perf_counter() - started
            assert info["rows"] == args.rows
            result[f"{fmt}_rows_per_s"] = round(args.rows / wall)
            result[f"{fmt}_s"] = round(wall, 2)
            result[f"{fmt}_mb"] = round(Path(info["path"]).stat().st_size / 2**20, 1)
            print(f"{fmt}: {wall:.2f} s", file=sys.stderr, flush=True)
        result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        result["loadavg_end"] = round(os.getloadavg()[0], 2)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "outputs_files.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
