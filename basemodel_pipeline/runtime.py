"""The machine a stage runs on: the device, torch's threads, mixed precision and batched forward passes.

Ground floor (docs/architecture.md): training, scenarios and inference all take these from here, so there is
one device resolver and one batched forward pass.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from basemodel_pipeline.errors import ArgumentError
from basemodel_pipeline.settings import setting

Array = np.ndarray | torch.Tensor


def resolve_device(choice: str) -> torch.device:
    """auto: the GPU when one is visible, else the CPU; `cuda` (or `cuda:N`) without a visible GPU is a
    UserError; anything else is passed to torch (`cpu`)."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice.startswith("cuda") and not torch.cuda.is_available():
        raise ArgumentError("device", choice, "no CUDA device is visible here; choose cpu (or auto)")
    return torch.device(choice)


# torch's compiler stack: torch's optimizers import it on first construction (0.8-1.5 s of Python here)
OPTIMIZER_IMPORTS = ("torch._dynamo",)


def import_beside(modules: tuple[str, ...] = OPTIMIZER_IMPORTS) -> threading.Thread:
    """Import `modules` on a daemon thread while the caller goes on: made while examples are featurised (torch
    kernels, which release the GIL), the first optimizer's import costs the stage nothing. Python's import
    lock makes a caller that needs a module meanwhile wait for it, never import it twice."""
    thread = threading.Thread(
        target=lambda: [importlib.import_module(m) for m in modules], name="imports", daemon=True
    )
    thread.start()
    return thread


def cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_workers(tasks: int) -> int:
    """Threads for `tasks` independent pieces of numpy work: one per CPU, at most one per task."""
    return max(1, min(tasks, cpus()))


def set_threads() -> None:
    """All cores (up to 16), or BASEMODEL_TORCH_THREADS when several workers share the machine."""
    wanted = setting("BASEMODEL_TORCH_THREADS") or None
    torch.set_num_threads(int(wanted) if wanted else max(1, min(os.cpu_count() or 1, 16)))


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """CPU threads for the operations inside, the previous number restored after. Tiny operations (a linear
    head's steps on a frozen trunk's outputs) split over several threads spend their time waiting for each
    other, by far the most on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cpu_has_bf16() -> bool:
    """Native bf16 matmuls on this CPU (AVX512-BF16 or AMX): bf16 autocast is then ~2-3x faster than fp32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def native_bf16(device: torch.device) -> bool:
    """bf16 matmuls run natively on `device`: a GPU that supports them, a CPU with AVX512-BF16 or AMX."""
    return torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_has_bf16()


def autocast(device: torch.device, amp: torch.dtype | None | str = "cuda-bf16"):
    """Mixed precision context: amp=None is fp32; the default "cuda-bf16" is bf16 on CUDA only."""
    if amp == "cuda-bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    return torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None)


def batches(n: int, size: int, rng: np.random.Generator | None = None) -> Iterator[np.ndarray]:
    idx = rng.permutation(n) if rng is not None else np.arange(n)
    for a in range(0, n, size):
        yield idx[a : a + size]


def take(X: Array, idx: np.ndarray, device: torch.device) -> torch.Tensor:
    """Rows idx of a numpy array or a tensor, as a tensor on device; float16 storage (fine-tuning's features)
    arrives as float32, what the models' parameters are."""
    if isinstance(X, torch.Tensor):
        return X[torch.from_numpy(idx).to(X.device)].to(device)
    return _on_device(X[idx], device)


def _on_device(
    rows: np.ndarray | torch.Tensor, device: torch.device, keep_half: bool = False
) -> torch.Tensor:
    """Rows as a tensor on device; float16 as float32 unless `keep_half` (a forward pass under autocast: the
    trunk centres half-precision features in half precision, Trunk.residual)."""
    rows = (torch.from_numpy(np.asarray(rows)) if not isinstance(rows, torch.Tensor) else rows).to(device)
    return rows.float() if rows.dtype == torch.float16 and not keep_half else rows


@torch.no_grad()
def predict(
    model: nn.Module,
    X: Array,
    device: torch.device,
    batch_size: int = 4096,
    amp: torch.dtype | None | str = "cuda-bf16",
) -> np.ndarray:
    """Raw outputs (logits) of the model on X, as float32 numpy, written batch by batch into one array."""
    model.eval()
    out: np.ndarray | None = None
    for a in range(0, len(X), batch_size):  # slices: a view of a numpy array, not a copy
        with autocast(device, amp):
            rows = _on_device(X[a : a + batch_size], device, keep_half=torch.is_autocast_enabled(device.type))
            y = model(rows)
        if out is None:
            out = host_array((len(X), *y.shape[1:]), np.float32)
        torch.from_numpy(out[a : a + len(y)]).copy_(y)  # to float32 host memory in one copy
    return out if out is not None else np.zeros((0, 0), np.float32)


def host_array(shape: tuple[int, ...], dtype: type[np.generic]) -> np.ndarray:
    """An uninitialised numpy array from torch's host allocator, for fine-tuning's large matrices (features,
    trunk outputs). numpy asks the kernel for transparent huge pages on large arrays; where the kernel
    compacts memory for them synchronously (THP defrag "madvise", common on VMs) their first write costs
    several times that of small pages (1 GB: 0.9–1.8 s against 0.17–0.32 s on the benchmark machine)."""
    return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype).numpy()
