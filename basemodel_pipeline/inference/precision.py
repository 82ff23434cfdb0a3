"""Inference precision: fp32, bf16 autocast (GPUs and CPUs with native bf16), int8 dynamic quantization (CPU).

int8 quantizes the weights of the trunk's residual blocks and of the head to int8 and their activations on
the fly (torch's dynamic quantization, one scale per tensor). The input projection stays in float32: its input
is the standardised feature vector, whose rare outliers (hundreds of standard deviations for a feature that was
almost constant in training) would set the activation scale and round every other feature to zero — quantizing
it too cost 0.25 AUROC on The Complete Journey's churn scenario, keeping it costs nothing measurable
(bench/bench_inference.py quality). LayerNorm, GELU and the standardisation stay in float32.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from basemodel_pipeline.errors import UserError
from basemodel_pipeline.runtime import native_bf16

PRECISIONS = ("auto", "fp32", "bf16", "int8")


def choose(precision: str, device: torch.device) -> str:
    """auto -> bf16 where the hardware runs it natively, else fp32."""
    if precision not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "int8" and device.type != "cpu":
        raise UserError("precision int8 runs on the CPU only; use bf16 on a GPU")
    return precision


FLOAT_LAYERS = ("trunk.proj",)  # see the module docstring


def quantize_int8(model: nn.Module) -> nn.Module:
    """Dynamic int8 quantization of the Linear layers but the input projection (weights int8, activations
    quantized per batch)."""
    from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

    spec = {
        name: default_dynamic_qconfig
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name not in FLOAT_LAYERS
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices: the kernels are what we measure
        return quantize_dynamic(model, spec, dtype=torch.qint8)


def prepare_model(
    model: nn.Module, precision: str, device: torch.device
) -> tuple[nn.Module, torch.dtype | None, str]:
    """(model on device, autocast dtype or None, the precision chosen)."""
    chosen = choose(precision, device)
    model = model.eval().to(device)
    if chosen == "int8":
        return quantize_int8(model), None, chosen
    return model, (torch.bfloat16 if chosen == "bf16" else None), chosen
