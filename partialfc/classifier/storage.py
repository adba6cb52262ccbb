"""Row tables: the center table and per-row optimizer state of one rank, stored compactly.

A :class:`RowTable` holds ``(rows, d)`` values in a storage dtype (float32 or bfloat16) on a
storage device (the compute device, or host memory — pinned when CUDA is available — for tables
larger than device memory). Each step only the active rows travel: :meth:`RowTable.read`
copies them into a reused float32 buffer on the compute device, the math runs in float32, and
:meth:`RowTable.write` stores them back.

bfloat16 storage keeps 8 significant bits, so a small update (``lr * weight_decay * w`` is
~5e-5 relative) would be rounded away every step with round-to-nearest. Writes therefore use
*stochastic rounding*: add 16 uniform random bits below the bfloat16 mantissa, then truncate.
The stored value is unbiased, ``E[round(x)] = x``, so small updates accumulate in expectation.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "RowTable",
    "ReusableBuffer",
    "stochastic_round_to_bfloat16",
    "chunk_rows",
    "resolve_chunk_rows",
    "SUPPORTED_DTYPES",
]

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
CHUNK_ROWS = 1 << 11  # CPU rows per layer / optimizer / rounding chunk: 2048 x 512 x 4 B = 4 MiB,
# small enough that a chunk's rows, gradient and state stay in the last-level cache
# accelerators: launch cost, not cache, matters; one chunk holds every active row of a rank up
# to r * C_local = 2^20 (r = 0.1 of 10^7 classes), so a step launches the same kernels at any C
# (a float32 chunk of d = 512 is 2 GiB)
DEVICE_CHUNK_ROWS = 1 << 20


def chunk_rows(device) -> int:
    """Default rows per chunk of the layer, the optimizer and compact-dtype conversions on
    ``device``: :data:`CHUNK_ROWS` on CPUs, :data:`DEVICE_CHUNK_ROWS` on accelerators."""
    return CHUNK_ROWS if torch.device(device).type == "cpu" else DEVICE_CHUNK_ROWS


def resolve_chunk_rows(value: int | None, device) -> int:
    """``value`` checked (a positive int), or the default of ``device`` when it is None.

    A step walks its ``n`` active rows in ``ceil(n / chunk)`` chunks: fewer, larger chunks
    launch fewer ops; each chunk holds about ``5 * chunk * d * 4`` bytes of float32 scratch
    (rows, gradient, optimizer rows and state, radial pass).
    """
    if value is None:
        return chunk_rows(device)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"chunk_rows must be a positive int or None, got {value!r}")
    return value


_NOISE_POOLS: dict[tuple[str, int], Tensor] = {}


def _noise_pool(device: torch.device, size: int) -> Tensor:
    """A fixed pool of iid uniform 16-bit integers, stored twice so any window is a view."""
    key = (str(device), size)
    if key not in _NOISE_POOLS:
        gen = torch.Generator(device="cpu").manual_seed(0x5EED)
        pool = torch.randint(0, 1 << 16, (size,), dtype=torch.int32, generator=gen)
        _NOISE_POOLS[key] = torch.cat([pool, pool]).to(device)
    return _NOISE_POOLS[key]


def stochastic_round_to_bfloat16(values: Tensor, generator: torch.Generator | None) -> Tensor:
    """Round float32 ``values`` to bfloat16 stochastically, **in place** on ``values``' bits.

    The 16 random bits per element come from a window, at a uniformly random offset, of a
    fixed pool of iid uniform integers (a view: two cheap passes instead of a per-element
    random number generator). Each element's noise is uniform over the pool, so
    ``E[round(x)] = x``. Returns the bfloat16 tensor; ``values`` is left truncated.
    """
    if values.dtype != torch.float32 or not values.is_contiguous():
        raise ValueError("stochastic rounding needs a contiguous float32 tensor")
    bits = values.view(-1).view(torch.int32)
    size = max(CHUNK_ROWS * 512, 1 << (bits.numel() - 1).bit_length())  # few distinct pools
    pool = _noise_pool(bits.device, size)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    offset = int(torch.randint(0, size, (1,), generator=generator, device=gen_device))
    bits.add_(pool[offset : offset + bits.numel()]).bitwise_and_(-65536)  # keep the top 16
    return values.to(torch.bfloat16)


class ReusableBuffer:
    """A float32 scratch buffer that grows on demand and is reused across steps.

    Fresh multi-GB allocations page in slowly; a buffer that keeps its memory does not.
    """

    def __init__(self, device, dtype=torch.float32, pin_memory: bool = False) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        self.pin_memory = pin_memory
        self._storage: Tensor | None = None

    def get(self, rows: int, cols: int) -> Tensor:
        """A ``(rows, cols)`` contiguous view (contents undefined)."""
        need = rows * cols
        if self._storage is None or self._storage.numel() < need:
            self._storage = torch.empty(
                max(need, 1), dtype=self.dtype, device=self.device, pin_memory=self.pin_memory
            )
        return self._storage[:need].view(rows, cols)


class RowTable:
    """``(num_rows, dim)`` values in a compact dtype with float32 reads and writes of row subsets.

    Args:
        num_rows: rows of the table.
        dim: row width.
        dtype: storage dtype, float32 or bfloat16.
        storage_device: where the table lives.
        compute_device: where :meth:`read` delivers rows.
        fill: initial values, a float tensor of the table shape (any dtype) or None for zeros.
        chunk_rows: rows per conversion chunk (staging buffer); None: the default of
            ``compute_device`` (:func:`chunk_rows`).
    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        dtype: torch.dtype,
        storage_device,
        compute_device,
        fill: Tensor | None = None,
        chunk_rows: int | None = None,
    ) -> None:
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"storage dtype must be one of {SUPPORTED_DTYPES}, got {dtype}")
        self.dtype = dtype
        self.storage_device = torch.device(storage_device)
        self.compute_device = torch.device(compute_device)
        self.chunk_rows = resolve_chunk_rows(chunk_rows, self.compute_device)
        self.staged = self.storage_device != self.compute_device
        pin = self.staged and self.storage_device.type == "cpu" and torch.cuda.is_available()
        self.data = torch.empty(num_rows, dim, dtype=dtype, device=self.storage_device,
                                pin_memory=pin)  # fmt: skip
        if fill is not None:
            self.data.copy_(fill)
        else:
            self.data.zero_()
        self._compute = ReusableBuffer(self.compute_device)
        self._staging = ReusableBuffer(self.storage_device, dtype=dtype, pin_memory=pin)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def read(self, rows: Tensor, out: ReusableBuffer | None = None) -> Tensor:
        """Float32 copy of ``data[rows]`` on the compute device, in a reused buffer.

        Conversions go through a staging buffer of at most :attr:`chunk_rows` rows, so a compact
        table never needs a full-size temporary in its own dtype.
        """
        n, dim = rows.numel(), self.data.shape[1]
        dest = (out or self._compute).get(n, dim)
        rows_s = rows.to(self.storage_device)
        if not self.staged and self.dtype == torch.float32:
            torch.index_select(self.data, 0, rows_s, out=dest)
            return dest
        step = self.chunk_rows
        for i in range(0, n, step):
            part = rows_s[i : i + step]
            stage = self._staging.get(part.numel(), dim)
            torch.index_select(self.data, 0, part, out=stage)
            dest[i : i + part.numel()].copy_(stage)
        return dest

    def write(self, rows: Tensor, values: Tensor, generator: torch.Generator | None) -> None:
        """Store float32 ``values`` into ``data[rows]`` (stochastic rounding for bfloat16).

        ``values`` may be overwritten (rounding works in place on its bits).
        """
        rows_s = rows.to(self.storage_device)
        if not self.staged and self.dtype == torch.float32:
            self.data.index_copy_(0, rows_s, values)
            return
        values = values.contiguous()
        step = self.chunk_rows
        for i in range(0, rows_s.numel(), step):
            part = values[i : i + step]
            if self.dtype == torch.bfloat16:
                part = stochastic_round_to_bfloat16(part, generator)
            if part.device != self.storage_device or part.dtype != self.dtype:
                stage = self._staging.get(*part.shape)
                stage.copy_(part)
                part = stage
            self.data.index_copy_(0, rows_s[i : i + part.shape[0]], part)

    def rows_float32(self, start: int, stop: int) -> Tensor:
        """Float32 copy of a contiguous row range (checkpoints, tests): never a view of the
        table, so later updates do not show through it."""
        rows = self.data[start:stop]
        return rows.clone() if rows.dtype == torch.float32 else rows.float()

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()
