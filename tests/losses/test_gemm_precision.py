"""GEMM operand precision: the emulated path is a bfloat16 GEMM with float32 accumulation.

Error bounds used here (unit roundoff u = 2^-8 for bfloat16, eps32 = 2^-24):
* emulated vs the exact product of the rounded operands: float32 summation only,
  ``|err| <= k eps32 sum |a||b|`` (k terms);
* native CPU bfloat16 (output rounded to bfloat16) vs emulated: one more rounding of the
  result, ``|err| <= u |y| + k eps32 sum |a||b|``;
* either vs float32 operands: ``|err| <= 2u sum |a||b|`` (each operand off by at most u).
"""

from __future__ import annotations

import pytest
import torch

from partialfc.losses import gemm_precision as gp
from partialfc.losses.gemm_precision import GemmPrecision, gemm_precision, matmul, round_to_dtype

U_BF16 = 2.0**-8
EPS32 = 2.0**-24


def _operands(m=7, k=33, n=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)


def test_float32_is_the_plain_product_and_default():
    a, b = _operands()
    prec = gemm_precision("float32", "cpu")
    assert prec.path == "float32" and prec.is_float32
    assert torch.equal(prec.mm(a, b), a @ b)


def test_emulated_equals_exact_product_of_rounded_operands():
    a, b = _operands(k=257)
    prec = gemm_precision("bfloat16", "cpu", path="emulated")
    assert prec.path == "emulated" and not prec.output_rounded
    exact = round_to_dtype(a, torch.bfloat16).double() @ round_to_dtype(b, torch.bfloat16).double()
    bound = a.shape[1] * EPS32 * (a.abs().double() @ b.abs().double())
    assert bool(((prec.mm(a, b).double() - exact).abs() <= bound).all())
    # ... and differs from the float32 product by rounding, within 2u sum |a||b|
    diff = (prec.mm(a, b) - a @ b).abs().double()
    assert bool((diff <= 2 * U_BF16 * (a.abs().double() @ b.abs().double())).all())
    assert float(diff.max()) > 1e-4  # the operands really were rounded


def test_emulated_equals_torch_native_bfloat16_matmul():
    a, b = _operands(m=16, k=64, n=12, seed=1)
    emulated = gemm_precision("bfloat16", "cpu", path="emulated").mm(a, b)
    native_prec = gemm_precision("bfloat16", "cpu", path="native")
    assert native_prec.path == "native" and native_prec.output_rounded  # CPU: bf16 output
    native = native_prec.mm(a, b)
    torch_bf16 = (a.bfloat16() @ b.bfloat16()).float()
    assert torch.equal(native, torch_bf16)
    k = a.shape[1]
    ra, rb = round_to_dtype(a, torch.bfloat16), round_to_dtype(b, torch.bfloat16)
    bound = U_BF16 * emulated.abs() + 2 * k * EPS32 * (ra.abs() @ rb.abs())
    assert bool(((native - emulated).abs() <= bound).all())


def test_addmm_and_out_forms_match_mm():
    a, b = _operands()
    for path in ("emulated", "native"):
        prec = gemm_precision("bfloat16", "cpu", path=path)
        out = torch.empty(a.shape[0], b.shape[1])
        assert torch.equal(prec.mm(a, b, out=out), prec.mm(a, b))
        acc = torch.ones(a.shape[0], b.shape[1])
        torch.testing.assert_close(prec.addmm_(acc, a, b), 1 + prec.mm(a, b))


def test_representable_operands_skip_the_rounding_pass_only_when_exact():
    a, _ = _operands()
    prec = gemm_precision("bfloat16", "cpu", path="emulated")
    exact = round_to_dtype(a, torch.bfloat16)
    assert prec.operand(exact, representable=True) is exact
    assert torch.equal(prec.operand(a), exact)


def test_differentiable_matmul_rounds_all_three_products():
    a, b = _operands()
    a.requires_grad_(True)
    b.requires_grad_(True)
    g = torch.randn(a.shape[0], b.shape[1], generator=torch.Generator().manual_seed(5))
    prec = gemm_precision("bfloat16", "cpu", path="emulated")
    matmul(a, b, prec).backward(g)
    r = lambda t: round_to_dtype(t.detach(), torch.bfloat16)  # noqa: E731
    torch.testing.assert_close(a.grad, r(g) @ r(b).t(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(b.grad, r(a).t() @ r(g), rtol=1e-6, atol=1e-6)


def test_float16_is_refused_on_cpu_and_names_the_setting():
    with pytest.raises(ValueError, match=r"head\.compute_dtype=float16 needs a GPU.*bfloat16"):
        gemm_precision("float16", "cpu", name="head.compute_dtype")
    with pytest.raises(ValueError, match=r"compute_dtype must be one of float32, bfloat16"):
        gemm_precision("int8", "cpu")
    with pytest.raises(ValueError, match=r"gemm_path must be one of auto, native, emulated"):
        gemm_precision("bfloat16", "cpu", path="fast")


def test_auto_path_follows_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(gp, "cpu_has_native_bfloat16", lambda: False)
    assert gemm_precision("bfloat16", "cpu") == GemmPrecision(torch.bfloat16, "emulated")
    monkeypatch.setattr(gp, "cpu_has_native_bfloat16", lambda: True)
    assert gemm_precision("bfloat16", "cpu") == GemmPrecision(torch.bfloat16, "native", True)


def test_cpu_flag_reader_sees_this_machine():
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    gp.cpu_has_native_bfloat16.cache_clear()
    assert gp.cpu_has_native_bfloat16() == ("avx512_bf16" in flags or "amx_bf16" in flags)


def _head_case(k):
    from partialfc.losses.margins import ArcFaceMargin

    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(10, 32, generator=gen), torch.randint(0, 13, (10,), generator=gen)
    return x, y, ArcFaceMargin(0.5, 32.0)


@pytest.mark.parametrize("k", [1, 3])  # 1: the fused normalise+GEMM+softmax; 3: sub-centers
def test_dense_head_bfloat16_within_tolerance_and_gemms_rounded(k):
    """MarginSoftmaxHead in bfloat16 compute: the loss equals the rounded-operand float64 loss
    (1e-5) and is within s u sqrt(2/d) of float32; gradients within 2u + s u sqrt(2/d)
    (see tests/classifier/test_partial_fc_precision.py for the derivation)."""
    import math

    import torch.nn.functional as F

    from partialfc.losses.heads import MarginSoftmaxHead

    x, y, margin = _head_case(k)
    out = {}
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)
        head = MarginSoftmaxHead(
            13, 32, margin, num_subcenters=k, compute_dtype=dtype, gemm_path="emulated"
        )  # the exact bound holds on every CPU
        with torch.no_grad():
            head.weight.mul_(25.0)  # centers of norm ~1
        xl = x.clone().requires_grad_(True)
        loss = head(xl, y)
        loss.backward()
        out[dtype] = (loss.item(), xl.grad, head.weight.grad, head.weight.detach())
        assert head.precision().path == ("float32" if dtype == "float32" else "emulated")
    w = out["bfloat16"][3]
    r = lambda t: round_to_dtype(t, torch.bfloat16).double()  # noqa: E731
    cos = (r(F.normalize(x, dim=1)) @ r(w).t()) / w.double().norm(dim=1)
    if k > 1:  # sub-center path: the normalised centers are the GEMM operand
        cos = r(F.normalize(x, dim=1)) @ r(F.normalize(w, dim=1)).t()
    cos = cos.view(10, 13, k).amax(dim=2)
    theta = torch.acos(cos.gather(1, y[:, None]).clamp(-1, 1))
    logits = torch.scatter(cos, 1, y[:, None], torch.cos(theta + 0.5)) * 32.0
    exact = F.cross_entropy(logits, y).item()
    s, d = 32.0, 32
    assert out["bfloat16"][0] == pytest.approx(exact, rel=1e-5, abs=1e-5)
    assert abs(out["bfloat16"][0] - out["float32"][0]) <= s * U_BF16 * math.sqrt(2 / d)
    assert out["bfloat16"][0] != out["float32"][0]
    for i in (1, 2):
        rel = (out["bfloat16"][i] - out["float32"][i]).norm() / out["float32"][i].norm()
        assert float(rel) <= 2 * U_BF16 + s * U_BF16 * math.sqrt(2 / d)


def test_dense_head_float16_refused_on_cpu_at_forward():
    from partialfc.losses.heads import MarginSoftmaxHead

    x, y, margin = _head_case(1)
    head = MarginSoftmaxHead(13, 32, margin, compute_dtype="float16")
    with pytest.raises(ValueError, match="compute_dtype=float16 needs a GPU"):
        head(x, y)
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        MarginSoftmaxHead(13, 32, margin, compute_dtype="half")
