"""GPU backends for the installed TVM without rebuilding it.

The PyPI wheel ships TVM's OpenCL code generator but neither the OpenCL nor the Vulkan runtime;
``import tvm`` loads ``tvm/lib/libtvm_runtime_{opencl,vulkan}.so`` when they exist, so
:mod:`.sidecars` compiles those two runtimes from TVM's sources against the wheel and installs them.
"""
