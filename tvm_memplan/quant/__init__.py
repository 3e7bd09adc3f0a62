"""Int8 QDQ models: validation of what can be lowered, the QDQ → integer kernel pass, its kernels."""
