"""Deploy planned models: build artifacts for devices, measure them locally or over TVM RPC, tune kernels.

``build`` turns a model into a shared library plus a JSON manifest; ``measure`` runs an artifact on a
device (this machine, or one reached through an RPC tracker) and appends the numbers to a JSON-lines
log; ``rpc`` starts a loopback tracker and servers for tests and demos; ``tune`` runs MetaSchedule.
``emit_c`` and ``mcu`` write the whole model as standalone C on one static arena, and ``standalone``
runs that C here or on an emulated Cortex-M and measures its SRAM, flash and instructions.
"""


def error_line(exc: BaseException) -> str:
    """The line of an exception worth showing: TVM puts the reason last, after its traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
