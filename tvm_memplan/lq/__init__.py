"""LQ dense: LQ-Nets learned low-bit quantization (docs/design.md, "LQ dense") lowered to bitserial TIR kernels."""
