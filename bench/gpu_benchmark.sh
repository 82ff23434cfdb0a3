#!/usr/bin/env bash
# One short GPU check for a lent H200 (< 10 minutes): build, test the GPU path, benchmark, leave JSON in $OUT.
#   bash bench/gpu_benchmark.sh            (on the GPU machine, from the repository root)
# Needs a Python with CUDA torch and this project's requirements (pip install -r requirements.lock with the
# CUDA torch wheel instead of the CPU one). Figures go to bench/results/foundation_synthetic_*_cuda.json.
set -euo pipefail
OUT=${OUT:-bench/results}
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.__version__, torch.cuda.get_device_name())"
$PY -m pip install -q --no-deps -e . >/dev/null
# 1. the GPU featuriser equals the CPU one on tiny data (same code path, event store in device memory)
$PY - <<'PY'
import numpy as np, tempfile, pathlib, torch
from basemodel_pipeline.synthetic import write_tiny_dataset
from basemodel_pipeline.config import load_config
from basemodel_pipeline.pipeline import run_extract, run_cache
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.training.pretrain import fit_encoder
d = pathlib.Path(tempfile.mkdtemp())
cfg = load_config(write_tiny_dataset(d))
run_extract(cfg); cache = EventCache(run_cache(cfg)["path"]); enc = fit_encoder(cache, cfg)
e = np.arange(cache.n_entities); t = np.full(len(e), int(cache.source("transactions").ts.max()))
a, b = enc.history(cache, e, t, device="cpu"), enc.history(cache, e, t, device="cuda")
print("cpu vs cuda featurisation max abs diff", float(np.abs(a - b).max())); assert np.allclose(a, b, atol=1e-3)
PY
# 2. foundation training + featurisation + embeddings on 50M synthetic events, on the GPU
timeout 480 $PY bench/bench_foundation.py --events 50000000 --customers 500000 --device cuda \
  --workdir /tmp/bm_synthetic_50M
cp bench/results/foundation_synthetic_*_cuda.json "$OUT"/ 2>/dev/null || true
