"""What a built Relax VM executable ships: the tensors of its constant pool, read from its serialization.

The weights a user ships are what the VM executable holds, after every pass of the build (folded
constants, repacked weights, lookup tables, requantization multipliers), not the ONNX initializers.
The executable serializes its constant pool with TVM's tensor format (``SaveDLTensor``): a magic
number, reserved word, device, ndim, dtype, shape, byte count, then the bytes. The serialization is
read tensor by tensor, each one's bytes skipped, so weight bytes never match the magic. An exported
library holds the same serialization, uncompressed, beside the kernels' code.

(Serializing an executable makes TVM 0.27 log a "Scope Saving" warning per memory scope, as
``export_library`` does.)
"""

from __future__ import annotations

import struct
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import tvm

TENSOR_MAGIC = struct.pack("<Q", 0xDD5E40F096B4A13F)
"""``kTVMNDArrayMagic``: the first word of every serialized tensor."""

_TYPE_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat"}


@dataclass(frozen=True)
class PooledConstant:
    """One tensor of the executable's constant pool."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def parse_constants(serialized: bytes) -> list[PooledConstant]:
    """Every tensor in a serialized VM executable, in pool order."""
    constants = []
    position = serialized.find(TENSOR_MAGIC)
    while position >= 0:
        offset = position + 16  # magic, reserved
        _device_type, _device_id, ndim = struct.unpack_from("<iii", serialized, offset)
        offset += 12
        code, bits, lanes = struct.unpack_from("<BBH", serialized, offset)
        offset += 4
        if not 0 <= ndim <= 32 or code not in _TYPE_CODES:
            raise ValueError(f"not a serialized tensor at byte {position}")
        shape = struct.unpack_from(f"<{ndim}q", serialized, offset)
        offset += 8 * ndim
        (nbytes,) = struct.unpack_from("<q", serialized, offset)
        offset += 8
        elements = 1
        for dim in shape:
            elements *= dim
        if nbytes != elements * ((bits * lanes + 7) // 8) or offset + nbytes > len(serialized):
            raise ValueError(f"tensor at byte {position}: {nbytes} bytes for shape {shape} of {bits}-bit elements")
        dtype = f"{_TYPE_CODES[code]}{bits}" + (f"x{lanes}" if lanes != 1 else "")
        constants.append(PooledConstant(tuple(shape), dtype, nbytes))
        position = serialized.find(TENSOR_MAGIC, offset + nbytes)
    return constants


def executable_constants(executable: tvm.runtime.Executable) -> list[PooledConstant]:
    """The constant pool of a Relax VM executable (what ``tvm.compile`` returns)."""
    with tempfile.TemporaryDirectory(prefix="tvm-memplan-exe-") as tmp:
        path = Path(tmp) / "executable.bin"
        executable.mod.write_to_file(str(path), "bin")
        return parse_constants(path.read_bytes())


def library_constants(path: Path) -> list[PooledConstant]:
    """The constant pool of an exported library (``export_library``): the serialized executable is
    packed into it uncompressed."""
    return parse_constants(Path(path).read_bytes())


@dataclass(frozen=True)
class ConstantBytes:
    """The constant pool's bytes, in all and per element type."""

    total: int
    by_dtype: dict[str, int]

    def __str__(self) -> str:
        parts = " + ".join(
            f"{nbytes:,} {dtype}" for dtype, nbytes in sorted(self.by_dtype.items(), key=lambda i: -i[1])
        )
        return f"{self.total:,} ({parts})" if len(self.by_dtype) > 1 else f"{self.total:,}"


def constant_bytes(constants: tvm.runtime.Executable | list[PooledConstant]) -> ConstantBytes:
    """Bytes of the tensors a built executable (or a parsed constant pool) holds: the weights as shipped."""
    if not isinstance(constants, list):
        constants = executable_constants(constants)
    by_dtype: Counter[str] = Counter()
    for constant in constants:
        by_dtype[constant.dtype] += constant.nbytes
    return ConstantBytes(sum(by_dtype.values()), dict(by_dtype))
