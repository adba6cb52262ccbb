"""InsightFace verification pair files (``lfw.bin``, ``cfp_fp.bin``, ``agedb_30.bin``, ...).

Such a file is a pickle of ``(bins, issame_list)``: ``bins`` holds 2·P encoded images (JPEG or
PNG bytes; pair ``p`` is ``bins[2p], bins[2p+1]``) and ``issame_list`` P booleans (a list of
bools, or a numpy bool array in files written from numpy). Many were written by Python 2, so
strings read back as bytes.

A pickle is a program: the standard unpickler runs arbitrary code, lets ``numpy.ndarray``
read memory outside its buffer (a negative ``offset``), and allocates whatever sizes the file
claims (a 9-byte pickle can ask for 16 GB of memo table). These files are therefore read by a
small interpreter of their own that knows only the opcodes and constructors real verification
files use: lists and tuples, bytes and strings, bools and small ints, and numpy **bool**
arrays/scalars rebuilt from bytes that are in the file. Every object it makes is built from
bytes present in the file, so memory is bounded by the file size. Anything else (``os.system``,
``eval``, ndarray construction with shapes, offsets or other dtypes) is refused with
:class:`UnsafePickleError` naming the file.
"""

from __future__ import annotations

import mmap
import os
import pickle
import pickletools
import struct
from pathlib import Path

import numpy as np

from partialfc.atomic import atomic_output
from partialfc.data.decode import decode_image


class UnsafePickleError(pickle.UnpicklingError, ValueError):
    """A pickle uses a construct that a verification ``.bin`` never contains."""


_OPNAMES = {ord(op.code): op.name for op in pickletools.opcodes}
_LATIN1 = ("latin1", "latin-1", b"latin1", b"latin-1")
_NUMPY_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray")
_NUMERIC_MODULES = ("numpy.core.numeric", "numpy._core.numeric")


class _Refused(Exception):
    """Raised inside the interpreter for a construct outside the accepted structure."""


class _Malformed(Exception):
    """Raised inside the interpreter for bytes that are not a well-formed pickle."""


class _NdarrayClass:
    """Stands for ``numpy.ndarray``; only usable as the first argument of ``_reconstruct``."""


class _BoolDtype:
    """Stands for ``numpy.dtype('b1')``; its pickled state is accepted and ignored."""


class _ArrayStub:
    """An empty array from ``_reconstruct``; becomes a bool array when its state is set."""

    value: np.ndarray | None = None


_NDARRAY = _NdarrayClass()


def _bool_array(raw: bytes, length, what: str) -> np.ndarray:
    if not isinstance(raw, (bytes, bytearray)):
        raise _Refused(f"{what}: array data is {type(raw).__name__}, expected bytes")
    if not isinstance(length, int) or isinstance(length, bool) or length != len(raw):
        size = _describe(length)
        raise _Refused(f"{what}: shape ({size},) does not match {len(raw)} data bytes")
    return np.frombuffer(bytes(raw), dtype=np.uint8) != 0


def _describe(value) -> str:
    """A short description of a pickled value for error messages (never a deep repr)."""
    if isinstance(value, (str, bytes, int)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"a {type(value).__name__}"


def _one_dim(shape, what: str):
    if not isinstance(shape, tuple) or len(shape) != 1:
        raise _Refused(f"{what}: shape is not 1-D")
    return shape[0]


def _encode(args):
    """``_codecs.encode(str, "latin1")``: how Python 3 writes bytes into protocol-2 pickles."""
    if len(args) != 2 or not isinstance(args[0], str) or args[1] not in _LATIN1:
        raise _Refused("_codecs.encode is only accepted as (str, 'latin1')")
    try:
        return args[0].encode("latin1")
    except UnicodeEncodeError:
        raise _Malformed("_codecs.encode of a non-latin-1 string") from None


def _bytearray(args):
    if len(args) == 1 and isinstance(args[0], bytes):
        return args[0]
    if len(args) == 2 and isinstance(args[0], str) and args[1] in _LATIN1:
        return _encode(args)
    raise _Refused("bytearray is only accepted from bytes")


def _dtype(args):
    if not args or args[0] not in ("b1", b"b1", "?", b"?"):
        name = _describe(args[0]) if args else "()"
        raise _Refused(f"numpy dtype {name}: only bool arrays are accepted")
    return _BoolDtype()


def _reconstruct(args):
    if len(args) != 3 or args[0] is not _NDARRAY or args[1] != (0,) or args[2] not in ("b", b"b"):
        raise _Refused("numpy _reconstruct is only accepted as (ndarray, (0,), 'b')")
    return _ArrayStub()


def _scalar(args):
    if len(args) != 2 or not isinstance(args[0], _BoolDtype):
        raise _Refused("numpy scalar is only accepted for bool")
    raw = args[1]
    if not isinstance(raw, bytes) or len(raw) != 1:
        raise _Refused("numpy bool scalar needs exactly one data byte")
    return raw != b"\0"


def _frombuffer(args):
    """Protocol 5: ``numpy._core.numeric._frombuffer(buffer, dtype, shape, order)``."""
    if len(args) != 4 or not isinstance(args[1], _BoolDtype) or args[3] not in ("C", "F"):
        raise _Refused("numpy _frombuffer is only accepted for 1-D bool arrays")
    return _bool_array(args[0], _one_dim(args[2], "numpy bool array"), "numpy bool array")


_GLOBALS = {
    ("_codecs", "encode"): _encode,
    ("__builtin__", "bytearray"): _bytearray,
    ("builtins", "bytearray"): _bytearray,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _dtype,
    **{(m, "_reconstruct"): _reconstruct for m in _NUMPY_MODULES},
    **{(m, "scalar"): _scalar for m in _NUMPY_MODULES},
    **{(m, "_frombuffer"): _frombuffer for m in _NUMERIC_MODULES},
}
_CALLABLE = {_encode, _bytearray, _dtype, _reconstruct, _scalar, _frombuffer}


def _build(obj, state):
    """The ``BUILD`` opcode: only numpy bool dtypes and arrays accept a state."""
    if isinstance(obj, _BoolDtype):
        if not isinstance(state, tuple):
            raise _Refused("numpy dtype state is not a tuple")
        return obj
    if isinstance(obj, _ArrayStub) and obj.value is None:
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise _Refused("numpy array state is not (version, shape, dtype, fortran, data)")
        shape, dtype, _, raw = state[-4:]
        if not isinstance(dtype, _BoolDtype):
            raise _Refused("numpy array state has a dtype other than bool")
        obj.value = _bool_array(raw, _one_dim(shape, "numpy bool array"), "numpy bool array")
        return obj
    raise _Refused(f"cannot set the state of a {type(obj).__name__}")


class _Interpreter:
    """Runs the opcodes of a pickle that real verification files use; nothing else."""

    def __init__(self, data):
        self.data = data
        self.pos = 0
        # constructors copy their data argument; a memo reference can hand the same string to
        # many calls, so the copies together may not exceed what the file itself holds
        self.budget = len(data)

    def spend(self, values, where: int) -> None:
        size = max((len(v) for v in values if isinstance(v, (str, bytes))), default=0)
        self.budget -= size
        if self.budget < 0:
            raise _Refused(f"byte {where}: the pickle builds more data than the file holds")

    def take(self, n: int, what: str) -> bytes:
        start = self.pos
        if n < 0 or n > len(self.data) - start:
            raise _Malformed(
                f"{what} at byte {start} claims {n} bytes but only {len(self.data) - start} remain"
            )
        self.pos = start + n
        return self.data[start : self.pos]

    def unpack(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def line(self, what: str, limit: int = 256) -> str:
        end = self.data.find(b"\n", self.pos, self.pos + limit)
        if end < 0:
            raise _Malformed(f"{what} at byte {self.pos} has no end of line")
        text = self.data[self.pos : end].decode("utf-8")
        self.pos = end + 1
        return text

    def run(self):
        stack: list = []
        marks: list[int] = []
        memo: dict[int, object] = {}

        def since_mark():
            if not marks:
                raise _Malformed(f"MARK missing before byte {self.pos - 1}")
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            return items

        def top():
            if not stack:
                raise _Malformed(f"stack empty at byte {self.pos - 1}")
            return stack[-1]

        while True:
            where = self.pos
            op = self.take(1, "opcode")[0]
            if op == 0x80:  # PROTO
                if self.take(1, "protocol")[0] > 5:
                    raise _Malformed("pickle protocol newer than 5")
            elif op == 0x95:  # FRAME: the length is advisory, the opcodes follow inline
                self.take(8, "frame length")
            elif op == ord("."):  # STOP
                if len(stack) != 1 or marks:
                    raise _Malformed(f"STOP at byte {where} with a stack of {len(stack)}")
                return stack[0]
            elif op == ord("("):
                marks.append(len(stack))
            elif op == ord("]"):
                stack.append([])
            elif op == ord(")"):
                stack.append(())
            elif op == ord("l"):
                stack.append(since_mark())
            elif op == ord("t"):
                stack.append(tuple(since_mark()))
            elif op in (0x85, 0x86, 0x87):  # TUPLE1..3
                n = op - 0x84
                if len(stack) - (marks[-1] if marks else 0) < n:
                    raise _Malformed(f"TUPLE{n} at byte {where} without {n} items")
                items = tuple(stack[-n:])
                del stack[-n:]
                stack.append(items)
            elif op == ord("a"):
                item = stack.pop()
                target = top()
                if not isinstance(target, list):
                    raise _Malformed(f"APPEND at byte {where} to a {type(target).__name__}")
                target.append(item)
            elif op == ord("e"):
                items = since_mark()
                target = top()
                if not isinstance(target, list):
                    raise _Malformed(f"APPENDS at byte {where} to a {type(target).__name__}")
                target.extend(items)
            elif op == ord("N"):
                stack.append(None)
            elif op in (0x88, 0x89):
                stack.append(op == 0x88)
            elif op == ord("I"):
                text = self.line("INT", 32)
                stack.append(text == "01" if text in ("00", "01") else int(text))
            elif op == ord("J"):
                stack.append(self.unpack("<i", "BININT"))
            elif op == ord("K"):
                stack.append(self.unpack("<B", "BININT1"))
            elif op == ord("M"):
                stack.append(self.unpack("<H", "BININT2"))
            elif op == 0x8A:  # LONG1
                n = self.take(1, "LONG1 length")[0]
                stack.append(int.from_bytes(self.take(n, "LONG1"), "little", signed=True))
            elif op in (ord("T"), ord("B")):  # BINSTRING (Python 2 str), BINBYTES
                stack.append(bytes(self.take(self.unpack("<I", "length"), "string")))
            elif op in (ord("U"), ord("C")):  # SHORT_BINSTRING, SHORT_BINBYTES
                stack.append(bytes(self.take(self.take(1, "length")[0], "string")))
            elif op in (0x8E, 0x96):  # BINBYTES8, BYTEARRAY8 (read back as bytes)
                stack.append(bytes(self.take(self.unpack("<Q", "length"), "bytes")))
            elif op in (ord("X"), 0x8C, 0x8D):  # BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
                fmt = {ord("X"): "<I", 0x8C: "<B", 0x8D: "<Q"}[op]
                raw = self.take(self.unpack(fmt, "length"), "unicode string")
                stack.append(raw.decode("utf-8", "surrogatepass"))
            elif op in (ord("q"), ord("r"), 0x94):  # BINPUT, LONG_BINPUT, MEMOIZE
                if op == 0x94:
                    key = len(memo)
                else:
                    key = self.unpack("<B" if op == ord("q") else "<I", "memo key")
                memo[key] = top()
            elif op in (ord("h"), ord("j")):  # BINGET, LONG_BINGET
                key = self.unpack("<B" if op == ord("h") else "<I", "memo key")
                if key not in memo:
                    raise _Malformed(f"memo key {key} read at byte {where} before it was set")
                stack.append(memo[key])
            elif op in (ord("c"), 0x93):  # GLOBAL, STACK_GLOBAL
                if op == ord("c"):
                    module, name = self.line("GLOBAL"), self.line("GLOBAL")
                else:
                    name, module = stack.pop(), stack.pop()
                    if not isinstance(module, str) or not isinstance(name, str):
                        raise _Malformed(f"STACK_GLOBAL at byte {where} without two strings")
                if (module, name) not in _GLOBALS:
                    raise _Refused(
                        f"the pickle references {module}.{name}, which a verification .bin "
                        "never contains (only lists of image bytes and bools are allowed)"
                    )
                stack.append(_GLOBALS[(module, name)])
            elif op == ord("R"):  # REDUCE
                args, func = stack.pop(), stack.pop()
                if func is _NDARRAY:
                    raise _Refused(f"byte {where}: direct numpy.ndarray construction")
                if func not in _CALLABLE or not isinstance(args, tuple):
                    raise _Malformed(f"REDUCE at byte {where} on a {type(func).__name__}")
                self.spend(args, where)
                stack.append(func(args))
            elif op == ord("b"):  # BUILD
                state = stack.pop()
                if isinstance(state, tuple) and state:
                    self.spend(state[-1:], where)
                stack.append(_build(stack.pop(), state))
            elif op in _OPNAMES:
                raise _Refused(
                    f"pickle opcode {_OPNAMES[op]} at byte {where} is not used by "
                    "verification .bin files"
                )
            else:
                raise _Malformed(f"invalid pickle opcode 0x{op:02x} at byte {where}")


def _parse(data, source: str):
    try:
        return _Interpreter(data).run()
    except _Refused as err:
        raise UnsafePickleError(f"{source}: refused to load: {err}") from None
    except (_Malformed, IndexError, TypeError, ValueError) as err:
        detail = str(err) if isinstance(err, _Malformed) else "malformed pickle"
        raise ValueError(f"{source}: not a readable verification pickle: {detail}") from None


def _check_structure(obj, source: str) -> tuple[list[bytes], np.ndarray]:
    if not isinstance(obj, (tuple, list)) or len(obj) != 2:
        raise ValueError(f"{source}: expected a pickled (images, issame) pair")
    bins, issame = obj
    if not isinstance(bins, (list, tuple)):
        raise ValueError(f"{source}: images are a {type(bins).__name__}, expected a list")
    for i, item in enumerate(bins):
        if not isinstance(item, bytes):
            raise ValueError(f"{source}: image {i} is {type(item).__name__}, expected bytes")
    if isinstance(issame, _ArrayStub):
        issame = issame.value
    if isinstance(issame, np.ndarray):
        flags = issame
    elif isinstance(issame, (list, tuple)):
        for i, flag in enumerate(issame):
            if not isinstance(flag, bool):
                raise ValueError(f"{source}: issame[{i}] is {type(flag).__name__}, expected bool")
        flags = np.asarray(issame, dtype=bool).reshape(-1)
    else:
        raise ValueError(f"{source}: issame is {type(issame).__name__}, expected bools")
    if len(bins) != 2 * len(flags):
        raise ValueError(f"{source}: {len(bins)} images for {len(flags)} pairs (need 2 per pair)")
    return list(bins), flags


def load_verification_bin(path: str | os.PathLike) -> tuple[list[bytes], np.ndarray]:
    """Read a verification ``.bin`` -> (2·P encoded images, bool array (P,) same identity).

    Raises UnsafePickleError for constructs a verification file never holds (code, other
    numpy arrays) and ValueError naming the file for a truncated or malformed one.
    """
    path = Path(path)
    source = str(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError(f"{source}: not a readable verification pickle: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            obj = _parse(data, source)
    return _check_structure(obj, source)


def loads_restricted(data: bytes, source: str = "<bytes>"):
    """Interpret pickle ``data`` with the same restrictions as :func:`load_verification_bin`."""
    return _parse(bytes(data), source)


def write_verification_bin(
    path: str | os.PathLike, images: list[bytes], issame: np.ndarray | list[bool]
) -> None:
    """Write ``(images, issame)`` in the InsightFace layout (protocol 2, atomic replace)."""
    issame = [bool(x) for x in issame]
    if len(images) != 2 * len(issame):
        raise ValueError(f"{len(images)} images for {len(issame)} pairs (need 2 per pair)")
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        pickle.dump(([bytes(b) for b in images], issame), f, protocol=2)


def decode_images(images: list[bytes], source: str = "<bin>") -> np.ndarray:
    """Decode encoded images to one RGB uint8 array (N, H, W, 3); all must share a size."""
    decoded = [decode_image(b, f"{source}: image {i}") for i, b in enumerate(images)]
    shapes = {d.shape for d in decoded}
    if len(shapes) > 1:
        raise ValueError(f"{source}: images have different sizes {sorted(shapes)[:3]}")
    return np.stack(decoded) if decoded else np.zeros((0, 0, 0, 3), np.uint8)
