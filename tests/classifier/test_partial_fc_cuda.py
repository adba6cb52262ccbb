"""CUDA paths (skipped without a GPU): compute on the device, centers on the device or in
pinned host memory with only the active rows moved; both must agree with the dense reference
and with each other."""

from __future__ import annotations

import pytest
import torch

from partialfc.classifier import PartialFC, RowSparseSGD, init_center_rows
from partialfc.losses.margins import ArcFaceMargin
from tests.classifier.reference import dense_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
D = 32


def _batch(c, b, seed):
    gen = torch.Generator().manual_seed(500 + seed)
    return torch.randn(b, D, generator=gen), torch.randint(0, c, (b,), generator=gen)


def test_cuda_rate_one_matches_reference():
    c = 50
    pfc = PartialFC(c, D, ArcFaceMargin(0.5, 32.0), device="cuda", init_std=0.3, seed=4)
    x, y = _batch(c, 24, 0)
    xc = x.cuda().requires_grad_(True)
    loss = pfc(xc, y.cuda())
    loss.backward()
    ref_loss, ref_gx, ref_gw = dense_reference(
        x, init_center_rows(c, D, 1, 4, 0, c, std=0.3), y, scale=32.0, m2_rad=0.5
    )
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    torch.testing.assert_close(xc.grad.cpu().double(), ref_gx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        pfc.active_rows.center_grad().cpu().double(), ref_gw, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_host_storage_matches_device_storage(dtype):
    c = 400
    kw = dict(sample_rate=0.3, init_std=0.3, seed=5, storage_dtype=dtype, device="cuda")
    on_device = PartialFC(c, D, ArcFaceMargin(0.5, 32.0), **kw)
    on_host = PartialFC(c, D, ArcFaceMargin(0.5, 32.0), storage_device="cpu", **kw)
    assert on_host.centers.data.device.type == "cpu" and on_host.centers.data.is_pinned()
    assert on_device.centers.data.device.type == "cuda"
    opts = [RowSparseSGD(m, lr=0.2) for m in (on_device, on_host)]
    for step in range(3):
        x, y = _batch(c, 32, step)
        losses = []
        for m, opt in zip((on_device, on_host), opts, strict=True):
            loss = m(x.cuda(), y.cuda())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        # identical rows and math; bfloat16 rounding noise differs between the two generators
        assert losses[1] == pytest.approx(losses[0], rel=1e-6 if dtype == torch.float32 else 1e-2)
    a, b = on_device.centers.data.cpu().float(), on_host.centers.data.float()
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    else:
        assert ((a - b).norm() / a.norm()).item() < 1e-2
