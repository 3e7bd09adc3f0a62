"""LQ dense: LQ-Nets learned low-bit quantization (seed 002) lowered to bitserial TIR kernels."""
