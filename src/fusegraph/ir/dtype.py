"""Element types of the IR, and their mapping to ONNX, NumPy and torch.

``DType`` values are the ONNX ``TensorProto`` codes, so a frontend maps 1:1. The torch and
NumPy mappings live here and nowhere else. Types torch cannot hold (strings, 4-bit types)
have no torch dtype; ops on them are unsupported by the runtime.
"""
from __future__ import annotations

import enum

import numpy as np
import torch


class DType(enum.IntEnum):
    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26

    @property
    def short(self) -> str:
        return _SHORT.get(self, self.name.lower())

    @property
    def is_float(self) -> bool:
        return self in FLOAT_TYPES

    @property
    def is_integer(self) -> bool:
        return self in INT_TYPES

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE.get(self, 1)

    def to_torch(self) -> torch.dtype:
        try:
            return _TO_TORCH[self]
        except KeyError:
            raise TypeError(f"dtype {self.name} has no torch equivalent") from None

    def to_numpy(self) -> np.dtype:
        try:
            return np.dtype(_TO_NUMPY[self])
        except KeyError:
            raise TypeError(f"dtype {self.name} has no numpy equivalent") from None

    @staticmethod
    def from_torch(dt: torch.dtype) -> "DType":
        try:
            return _FROM_TORCH[dt]
        except KeyError:
            raise TypeError(f"torch dtype {dt} has no fusegraph equivalent") from None

    @staticmethod
    def from_numpy(dt) -> "DType":
        dt = np.dtype(dt)
        found = _FROM_NUMPY.get(dt)
        if found is None:
            found = _FROM_NUMPY_NAME.get(dt.name)
        if found is None:
            raise TypeError(f"numpy dtype {dt} has no fusegraph equivalent")
        return found


FLOAT_TYPES = frozenset({
    DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16, DType.FLOAT8E4M3FN,
    DType.FLOAT8E4M3FNUZ, DType.FLOAT8E5M2, DType.FLOAT8E5M2FNUZ, DType.FLOAT4E2M1, DType.FLOAT8E8M0,
})
INT_TYPES = frozenset({
    DType.UINT8, DType.INT8, DType.UINT16, DType.INT16, DType.INT32, DType.INT64, DType.UINT32,
    DType.UINT64, DType.UINT4, DType.INT4, DType.UINT2, DType.INT2,
})

_SHORT = {
    DType.FLOAT: "f32", DType.FLOAT16: "f16", DType.DOUBLE: "f64", DType.BFLOAT16: "bf16",
    DType.INT8: "i8", DType.INT16: "i16", DType.INT32: "i32", DType.INT64: "i64",
    DType.UINT8: "u8", DType.UINT16: "u16", DType.UINT32: "u32", DType.UINT64: "u64",
    DType.BOOL: "bool", DType.STRING: "str", DType.COMPLEX64: "c64", DType.COMPLEX128: "c128",
}

_TO_TORCH = {
    DType.FLOAT: torch.float32, DType.FLOAT16: torch.float16, DType.DOUBLE: torch.float64,
    DType.BFLOAT16: torch.bfloat16, DType.INT8: torch.int8, DType.INT16: torch.int16,
    DType.INT32: torch.int32, DType.INT64: torch.int64, DType.UINT8: torch.uint8,
    DType.UINT16: torch.uint16, DType.UINT32: torch.uint32, DType.UINT64: torch.uint64,
    DType.BOOL: torch.bool, DType.COMPLEX64: torch.complex64, DType.COMPLEX128: torch.complex128,
    DType.FLOAT8E4M3FN: torch.float8_e4m3fn, DType.FLOAT8E5M2: torch.float8_e5m2,
    DType.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz, DType.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
    DType.FLOAT8E8M0: torch.float8_e8m0fnu,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}

_TO_NUMPY = {
    DType.FLOAT: np.float32, DType.FLOAT16: np.float16, DType.DOUBLE: np.float64,
    DType.INT8: np.int8, DType.INT16: np.int16, DType.INT32: np.int32, DType.INT64: np.int64,
    DType.UINT8: np.uint8, DType.UINT16: np.uint16, DType.UINT32: np.uint32, DType.UINT64: np.uint64,
    DType.BOOL: np.bool_, DType.COMPLEX64: np.complex64, DType.COMPLEX128: np.complex128,
    DType.STRING: np.object_,
}
_FROM_NUMPY = {np.dtype(v): k for k, v in _TO_NUMPY.items()}
# ml_dtypes (used by onnx for bfloat16 / float8) are matched by name.
_FROM_NUMPY_NAME = {
    "bfloat16": DType.BFLOAT16, "float8_e4m3fn": DType.FLOAT8E4M3FN, "float8_e5m2": DType.FLOAT8E5M2,
    "float8_e4m3fnuz": DType.FLOAT8E4M3FNUZ, "float8_e5m2fnuz": DType.FLOAT8E5M2FNUZ,
    "int4": DType.INT4, "uint4": DType.UINT4, "float4_e2m1fn": DType.FLOAT4E2M1,
    "float8_e8m0fnu": DType.FLOAT8E8M0, "int2": DType.INT2, "uint2": DType.UINT2,
}
_ITEMSIZE = {
    DType.FLOAT: 4, DType.FLOAT16: 2, DType.DOUBLE: 8, DType.BFLOAT16: 2, DType.INT8: 1,
    DType.INT16: 2, DType.INT32: 4, DType.INT64: 8, DType.UINT8: 1, DType.UINT16: 2,
    DType.UINT32: 4, DType.UINT64: 8, DType.BOOL: 1, DType.COMPLEX64: 8, DType.COMPLEX128: 16,
    DType.STRING: 8,
}
