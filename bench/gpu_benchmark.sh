#!/usr/bin/env bash
# One short GPU check for an H200 machine (one command, < 10 minutes): test the CUDA path, then benchmark the
# foundation on 50M synthetic events (work counted: examples/s, history events/s, coverage) and the quality
# against the training budget (x1, x4, x16 examples per epoch, as many as fit before the deadline).
#   bash bench/gpu_benchmark.sh                  (on the GPU machine, from the repository root)
#   STEPS=scaling bash bench/gpu_benchmark.sh    (a second call: every stage's scaling curve on CUDA at
#                                                 SCALING_EVENTS, 1M 5M 10M by default, as many as fit)
# Needs a Python with CUDA torch; the project's packages that machine lacks (pydantic, duckdb, sqlglot,
# LightGBM) come as wheels in .whl/ (`pip download --no-deps -d .whl ...` beforehand: it reaches no index).
# Every step has its own time limit and the steps go on when one fails; results land in $OUT (default
# bench/results) as soon as each step ends.
# Not run here: a step in the trainer image (the GPU machine has no Docker engine).
set -uo pipefail
OUT=${OUT:-bench/results}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-560}  # the whole script's wall-clock budget
EVENTS=${EVENTS:-50000000}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu EVENTS=300000 BUDGET_S=300: the same script as a syntax check without a GPU
STEPS=${STEPS:-featuriser,foundation,budget}  # or scaling (its own call: it needs most of one command's time)
SCALING_EVENTS=${SCALING_EVENTS:-1000000 5000000 10000000}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
left() { echo $((BUDGET_S - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
mkdir -p "$OUT"
uptime | tee "$OUT/gpu_load.txt"
want() { [[ ",$STEPS," == *",$1,"* ]]; }
if [ "$DEVICE" = cuda ]; then
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.__version__, torch.cuda.get_device_name())" || exit 1
fi
if [ "$DEVICE" = cuda ] && want featuriser; then
echo "== 1. the CUDA featuriser equals the CPU one on tiny data ($(left) s left)"
timeout 120 $PY - <<'PY'
import pathlib, tempfile
import numpy as np
from basemodel_pipeline.cache.store import EventCache
from basemodel_pipeline.config import load_config
from basemodel_pipeline.pipeline import run_cache, run_extract
from basemodel_pipeline.demo.synthetic import write_tiny_dataset
from basemodel_pipeline.training.pretrain import fit_encoder
d = pathlib.Path(tempfile.mkdtemp())
cfg = load_config(write_tiny_dataset(d))
run_extract(cfg); cache = EventCache(run_cache(cfg)["path"]); enc = fit_encoder(cache, cfg)
e = np.arange(cache.n_entities); t = np.full(len(e), int(cache.source("transactions").ts.max()))
a, b = enc.history(cache, e, t, device="cpu"), enc.history(cache, e, t, device="cuda")
print("cpu vs cuda featurisation max abs diff", float(np.abs(a - b).max())); assert np.allclose(a, b, atol=1e-3)
PY
echo "featuriser check rc=$?"
fi

WORK=/tmp/bm_synthetic_$EVENTS
if want foundation; then
echo "== 2. foundation, featurisation and embeddings on $EVENTS synthetic events ($(left) s left)"
timeout $(( $(left) - 240 )) $PY bench/bench_foundation.py --events "$EVENTS" --customers $((EVENTS / 100)) \
  --device "$DEVICE" --workdir "$WORK"
echo "bench_foundation rc=$?"
cp bench/results/foundation_synthetic_*_"$DEVICE"*.json "$OUT"/ 2>/dev/null
fi

if want budget; then
echo "== 3. quality against the training budget, churn ($(left) s left)"
timeout $(( $(left) - 10 )) $PY bench/bench_budget.py --workdir "$WORK" --name "synthetic_$((EVENTS / 1000000))M" \
  --scales 1 4 16 --scenarios churn --device "$DEVICE" --deadline-s $(( $(left) - 30 ))
echo "bench_budget rc=$?"
cp bench/results/budget_synthetic_*.json "$OUT"/ 2>/dev/null
fi

if want scaling; then  # the results are written after each size, so a size cut by the time limit loses only itself
echo "== 4. scaling curves on $DEVICE: $SCALING_EVENTS events ($(left) s left)"
# shellcheck disable=SC2086
timeout $(( $(left) - 10 )) $PY bench/bench_scaling.py --device "$DEVICE" --events $SCALING_EVENTS \
  --root /tmp/bm_scaling
echo "bench_scaling rc=$?"
cp bench/results/scaling_"$DEVICE".json bench/results/scaling_"$DEVICE".png "$OUT"/ 2>/dev/null
fi
uptime | tee -a "$OUT/gpu_load.txt"
echo "done in $SECONDS s"
