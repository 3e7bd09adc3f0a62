"""Models in: ONNX files and zoo specs become Relax modules, with one-line errors for bad input."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from .errors import UserError

ZOO_PREFIX = "zoo:"


@dataclass
class LoadedModel:
    """An ONNX model and where it came from."""

    name: str
    onnx_model: onnx.ModelProto

    def input_specs(self) -> list[tuple[str, tuple[int | str, ...], np.dtype]]:
        """Graph inputs that are not initializers: (name, shape with symbolic dims as str, dtype)."""
        initializers = {init.name for init in self.onnx_model.graph.initializer}
        specs = []
        for value in self.onnx_model.graph.input:
            if value.name in initializers:
                continue
            tensor_type = value.type.tensor_type
            dims: list[int | str] = []
            for dim in tensor_type.shape.dim:
                dims.append(dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or "?"))
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
            specs.append((value.name, tuple(dims), np.dtype(dtype)))
        return specs

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Reproducible inputs for every graph input; dynamic shapes cannot be run."""
        rng = np.random.default_rng(seed)
        inputs = {}
        for name, shape, dtype in self.input_specs():
            if not all(isinstance(d, int) and d > 0 for d in shape):
                raise UserError(f"input {name!r} has a dynamic shape {shape}; export the model with static shapes to run it")
            if np.issubdtype(dtype, np.floating):
                inputs[name] = rng.standard_normal(shape).astype(dtype)
            else:
                inputs[name] = rng.integers(0, 10, size=shape).astype(dtype)
        return inputs


def load_model(spec: str) -> LoadedModel:
    """Load ``spec``: an ONNX file path, or ``zoo:NAME[?key=value&...]``."""
    if spec.startswith(ZOO_PREFIX):
        from . import zoo

        name, params = zoo.parse_spec(spec)
        return LoadedModel(spec[len(ZOO_PREFIX):], zoo.build(name, **params))
    path = Path(spec)
    if not path.exists():
        raise UserError(f"no such model file: {spec}")
    if path.is_dir():
        raise UserError(f"{spec} is a directory, not an ONNX file")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx raises DecodeError, ValidationError, ...
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{spec} is not a valid ONNX model: {first_line}") from None
    return LoadedModel(path.stem, model)


def unsupported_operators(model: onnx.ModelProto) -> list[str]:
    """ONNX operator types TVM's Relax frontend cannot import."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    supported = _get_convert_map()
    used = {node.op_type for node in model.graph.node if node.domain in ("", "ai.onnx")}
    return sorted(used - set(supported))


def to_relax(model: LoadedModel):
    """Import into a Relax IRModule with weights as constants (what the planner sees).

    Exporters compute some shapes at run time (the TorchScript exporter's ``chunk`` is
    ``Shape -> Gather -> Div -> Slice``); TVM's importer leaves such computations in the graph and
    its legalization then fails. When the inputs are static and onnxruntime's constant folding
    resolves them all, the folded graph is imported instead."""
    from tvm.relax.frontend.onnx import from_onnx

    from .quant.validate import check_quantization

    check_quantization(model.onnx_model, model.name)
    missing = unsupported_operators(model.onnx_model)
    if missing:
        raise UserError(f"{model.name}: unsupported ONNX operator(s) {', '.join(missing)} (TVM 0.27 Relax frontend)")
    try:
        mod = from_onnx(model.onnx_model, keep_params_in_input=False)
        if _computes_shapes(mod) and _static_inputs(model):
            folded = from_onnx(fold_constants(model.onnx_model), keep_params_in_input=False)
            mod = mod if _computes_shapes(folded) else folded
    except UserError:
        raise
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{model.name}: TVM could not import the model: {first_line}") from None
    return mod


_SHAPE_OPS = {"relax.shape_of", "relax.shape_to_tensor", "relax.tensor_to_shape"}


def _computes_shapes(mod) -> bool:
    """Whether ``main`` has shape computations or tensors whose shapes are not constants."""
    from tvm import relax

    from .relax.tensor_types import static_shape

    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value, ty = binding.value, binding.var.ty
            if isinstance(value, relax.Call) and getattr(value.op, "name", None) in _SHAPE_OPS:
                return True
            if isinstance(ty, relax.TensorType) and static_shape(ty) is None:
                return True
    return False


def _static_inputs(model: LoadedModel) -> bool:
    return all(isinstance(d, int) and d > 0 for _, shape, _ in model.input_specs() for d in shape)


def fold_constants(onnx_model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph after onnxruntime's basic optimizations (constant folding, shapes of static
    tensors, redundant nodes): standard ONNX operators only."""
    import tempfile

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = str(Path(tmp) / "folded.onnx")
        try:
            ort.InferenceSession(onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors have no common base
            raise UserError(f"onnxruntime could not fold the graph's shape computations: {str(exc).splitlines()[0][:200]}") from None
        return onnx.load(options.optimized_model_filepath)
