"""``--device`` for inference: ``cpu``, ``cuda`` or ``cuda:N``, checked before any work.

PyTorch runs on the named device; onnxruntime uses its CUDA execution provider (package
``onnxruntime-gpu``) on ``cuda[:N]``. A device that is not there is a ValueError that says why.
"""

from __future__ import annotations

import re

import torch

_DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def parse_device(device: str | torch.device | None) -> torch.device:
    """``torch.device`` for ``cpu``/``cuda``/``cuda:N`` (None: cpu), after checking it exists."""
    if device is None:
        return torch.device("cpu")
    text = str(device)
    match = _DEVICE.match(text)
    if match is None:
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {text!r}")
    if match.group(1) == "cpu":
        if match.group(2) is not None:
            raise ValueError(f"--device cpu takes no index, got {text!r}")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = torch.version.cuda or "CPU-only"
        raise ValueError(
            f"--device {text}: CUDA is not available (torch {torch.__version__}, {build} build)"
        )
    index = int(match.group(2) or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"--device {text}: only {count} CUDA device(s) (cuda:0-cuda:{count - 1})")
    return torch.device("cuda", index)


def ort_providers(device: str | torch.device | None) -> list:
    """onnxruntime providers for ``device``; CUDA needs the ``onnxruntime-gpu`` package."""
    import onnxruntime as ort

    text = "cpu" if device is None else str(device)
    match = _DEVICE.match(text)
    if match is None:
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {text!r}")
    if match.group(1) == "cpu":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ValueError(
            f"--device {text} with the ONNX backend needs onnxruntime's CUDA provider: "
            f"install onnxruntime-gpu (available providers: {', '.join(available)})"
        )
    index = int(match.group(2) or 0)
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
