"""Run compiled programs and check plans against reality: stock TVM, onnxruntime, the VM's allocations."""

from .check import VerifyResult, verify_plan
from .run import AllocationTrace, flatten_outputs, run_vm, target_device

__all__ = ["AllocationTrace", "VerifyResult", "flatten_outputs", "run_vm", "target_device", "verify_plan"]
