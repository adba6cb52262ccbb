"""Low-precision GEMMs with float32 accumulation for the margin-softmax heads.

A head's *compute dtype* is the precision of the operands of its three large products (the
cosine GEMM ``w x^T``, the embedding gradient ``q^T w`` and the center gradient ``q x``);
everything else — norms, margin, max, ``exp``, sums, ``log``, the loss and the optimizer —
stays float32, as mixed-precision training prescribes (Micikevicius et al., "Mixed Precision
Training", ICLR 2018, §3: low-precision products, float32 accumulation; Kalamkar et al., "A
Study of BFLOAT16 for Deep Learning Training", arXiv 1905.12322).

Two paths give the same numbers up to the order of summation:

* ``native``: the operands are converted to the compute dtype and the hardware's
  low-precision GEMM runs (tensor cores on CUDA, AVX-512-BF16 / AMX on CPUs). On CUDA the
  product is written in float32 (``torch.mm(..., out_dtype=float32)``); a CPU bf16 GEMM
  accumulates in float32 but rounds its output to bfloat16 (one more relative error of at
  most ``2^-8`` on each product, which :attr:`GemmPrecision.output_rounded` reports).
* ``emulated``: each operand is rounded to the compute dtype (round to nearest even) and
  kept as float32, then a float32 GEMM runs. A product of two 8-bit (bfloat16) or 11-bit
  (float16) significands has at most 22 significant bits and is exact in float32's 24, so
  this *is* a low-precision GEMM with float32 accumulation, at the float32 GEMM's speed.

Which one runs (``path="auto"``, the default): ``native`` on CUDA and on CPUs that report
``avx512_bf16`` or ``amx_bf16``; ``emulated`` on other CPUs, where torch's bfloat16 GEMM is a
scalar fallback (measured 0.7 GFLOP/s against 57 in float32 on an AVX2-only Zen 3 core, see
``benchmarks/results/``). float16 is refused on CPUs (no fast float16 GEMM there; use
bfloat16). The decision is made once per head and is visible as :attr:`GemmPrecision.path`.

Error model (unit roundoff ``u = 2^-8`` for bfloat16, ``2^-11`` for float16): with both
operands rounded, a dot product of unit vectors changes by at most ``2u`` (Cauchy-Schwarz),
so a logit ``s cos`` by at most ``2 u s``; random rounding errors make the typical change
``~ u s sqrt(2 / d)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "COMPUTE_DTYPES",
    "GEMM_PATHS",
    "GemmPrecision",
    "check_gemm_path",
    "cpu_has_native_bfloat16",
    "gemm_precision",
    "matmul",
    "parse_compute_dtype",
    "round_to_dtype",
]

COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GEMM_PATHS = ("auto", "native", "emulated")
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=1)
def cpu_has_native_bfloat16() -> bool:
    """True when the CPU reports ``avx512_bf16`` or ``amx_bf16`` (Linux ``/proc/cpuinfo``).

    ``torch.backends.cpu.get_cpu_capability()`` names the vector ISA torch dispatches to
    (``AVX2``, ``AVX512``) but not the bfloat16 dot-product units, so the flags are read
    directly; where they cannot be read the answer is False (the emulated path, always exact).
    """
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return any(flag in flags for flag in _CPU_BF16_FLAGS)
    except OSError:
        pass
    return False


def parse_compute_dtype(value, name: str = "compute_dtype") -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` or the torch dtype -> the torch dtype."""
    if isinstance(value, torch.dtype) and value in COMPUTE_DTYPES.values():
        return value
    if isinstance(value, str) and value in COMPUTE_DTYPES:
        return COMPUTE_DTYPES[value]
    raise ValueError(f"{name} must be one of {', '.join(COMPUTE_DTYPES)}, got {value!r}")


def round_to_dtype(values: Tensor, dtype: torch.dtype) -> Tensor:
    """``values`` rounded to ``dtype`` (nearest even) and widened back: a new float32 tensor."""
    return values.to(dtype).to(values.dtype)


@functools.cache
def _cuda_mm_has_out_dtype(dtype: torch.dtype) -> bool:
    a = torch.ones(2, 2, dtype=dtype, device="cuda")
    try:
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError):
        return False


@dataclass(frozen=True)
class GemmPrecision:
    """How a head multiplies: ``dtype`` of the operands and the ``path`` that computes it.

    Attributes:
        dtype: float32, bfloat16 or float16.
        path: ``"float32"`` (no rounding), ``"native"`` or ``"emulated"`` (module docstring).
        output_rounded: the native product is rounded to ``dtype`` before it is widened
            (CPU bfloat16 GEMMs); False on the other paths.
    """

    dtype: torch.dtype
    path: str
    output_rounded: bool = False

    @property
    def is_float32(self) -> bool:
        return self.path == "float32"

    def operand(self, values: Tensor, representable: bool = False) -> Tensor:
        """``values`` as this precision feeds them to a GEMM (float32 tensors as given).

        ``representable=True`` says the values are already exact in ``dtype`` (e.g. rows read
        from a bfloat16 table): the emulated path then skips the rounding pass.
        """
        if self.path == "float32" or (representable and self.path == "emulated"):
            return values
        if self.path == "native":
            return values.to(self.dtype)
        return round_to_dtype(values, self.dtype)

    def mm(self, a: Tensor, b: Tensor, out: Tensor | None = None, rounded: bool = False):
        """float32 ``a @ b`` with low-precision operands (into ``out`` when given).

        ``rounded=True`` says both operands already went through :meth:`operand`.
        """
        if not rounded:
            a, b = self.operand(a), self.operand(b)
        if self.path != "native":
            return torch.mm(a, b, out=out) if out is not None else torch.mm(a, b)
        if not self.output_rounded:
            product = torch.mm(a, b, out_dtype=torch.float32)
        else:
            product = torch.mm(a, b)  # widened by the copy or the add below, in one pass
        if out is None:
            return product.float()
        return out.copy_(product)

    def addmm_(self, acc: Tensor, a: Tensor, b: Tensor, rounded: bool = False) -> Tensor:
        """``acc += a @ b`` (float32 ``acc``), low-precision operands (see :meth:`mm`)."""
        if not rounded:
            a, b = self.operand(a), self.operand(b)
        if self.path != "native":
            return acc.addmm_(a, b)
        if not self.output_rounded:
            return acc.add_(torch.mm(a, b, out_dtype=torch.float32))
        return acc.add_(torch.mm(a, b))  # the float32 add widens the rounded product

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        extra = ", output rounded" if self.output_rounded else ""
        return f"{name} ({self.path}{extra})"


class _Matmul(torch.autograd.Function):
    """``a @ b`` with low-precision operands in forward and in both backward products."""

    @staticmethod
    def forward(ctx, a, b, precision):
        ctx.save_for_backward(a, b)
        ctx.precision = precision
        return precision.mm(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        p = ctx.precision
        grad_a = p.mm(grad, b.t()) if ctx.needs_input_grad[0] else None
        grad_b = p.mm(a.t(), grad) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b, None


def matmul(a: Tensor, b: Tensor, precision: GemmPrecision) -> Tensor:
    """Differentiable float32 ``a @ b`` whose three GEMMs use ``precision``'s operands."""
    if precision.is_float32:
        return a @ b
    return _Matmul.apply(a, b, precision)


def check_gemm_path(path: str) -> str:
    """``path`` if it is one of :data:`GEMM_PATHS`, else ``ValueError``."""
    if path not in GEMM_PATHS:
        raise ValueError(f"gemm_path must be one of {', '.join(GEMM_PATHS)}, got {path!r}")
    return path


def gemm_precision(compute_dtype, device, path: str = "auto", name: str = "compute_dtype"):
    """The :class:`GemmPrecision` a head on ``device`` uses for ``compute_dtype``.

    Args:
        compute_dtype: ``"float32"`` (default everywhere), ``"bfloat16"`` or ``"float16"``.
        device: the compute device.
        path: ``"auto"`` (native where the hardware has low-precision units, see module
            docstring), ``"native"`` or ``"emulated"`` (to compare them, or to force one).
        name: the setting's name in error messages.
    """
    dtype = parse_compute_dtype(compute_dtype, name)
    check_gemm_path(path)
    device = torch.device(device)
    if dtype == torch.float32:
        return GemmPrecision(dtype, "float32")
    if dtype == torch.float16 and device.type == "cpu":
        raise ValueError(
            f"{name}=float16 needs a GPU: CPUs have no fast float16 GEMM; use bfloat16 on CPU"
        )
    if path == "auto":
        native = device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bfloat16())
        path = "native" if native else "emulated"
    rounded = path == "native" and not (device.type == "cuda" and _cuda_mm_has_out_dtype(dtype))
    return GemmPrecision(dtype, path, rounded)
