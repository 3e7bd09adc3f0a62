"""The ``tvm-memplan`` command line."""
