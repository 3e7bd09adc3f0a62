"""Models in: ONNX files and zoo specs become Relax modules, with one-line errors for bad input."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from .errors import UserError

ZOO_PREFIX = "zoo:"
INPUT_SHAPES_KEY = "input_shapes"
"""``MODEL?input_shapes=x:1x3x224x224,mask:1x128`` binds dynamic input dimensions when the model is loaded
(tvmc's ``--input-shapes``); the CLI's ``--input-shapes`` writes it, so a built artifact's manifest names
the model with the shapes it was built for."""


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
            if is_dynamic(shape):
                raise UserError(
                    f"input {name!r} has a dynamic shape {shape}: give --input-shapes {example_binding(name, shape)} "
                    "(or export the model with static shapes)"
                )
            if np.issubdtype(dtype, np.floating):
                inputs[name] = rng.standard_normal(shape).astype(dtype)
            elif np.dtype(dtype) in (np.int8, np.uint8):  # integer codes of a quantized input: their whole range
                info = np.iinfo(dtype)
                inputs[name] = rng.integers(info.min, info.max + 1, size=shape).astype(dtype)
            else:
                inputs[name] = rng.integers(0, 10, size=shape).astype(dtype)
        return inputs


def is_dynamic(shape: tuple[int | str, ...]) -> bool:
    """Whether an input shape (:meth:`LoadedModel.input_specs`) has a symbolic or unknown dimension."""
    return not all(isinstance(d, int) and d > 0 for d in shape)


def example_binding(name: str, shape: tuple[int | str, ...]) -> str:
    """``--input-shapes`` text for ``name`` with every dynamic dimension bound to 1 (``x:1x3x224x224``)."""
    return f"{name}:" + "x".join(str(d) if isinstance(d, int) and d > 0 else "1" for d in shape)


def parse_input_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """``"x:1x3x224x224,mask:1x128"`` -> ``{"x": (1, 3, 224, 224), "mask": (1, 128)}`` (a scalar: ``s:``)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in text.split(","):
        name, colon, dims = item.strip().rpartition(":")  # input names may hold colons (TensorFlow's "x:0")
        try:
            shape = tuple(int(d) for d in dims.split("x")) if dims.strip() else ()
        except ValueError:
            shape = (0,)
        if not colon or not name or any(d < 1 for d in shape):
            raise UserError(f"input shapes look like NAME:1x3x224x224[,NAME:...], got {item.strip()!r}")
        shapes[name] = shape
    return shapes


def format_input_shapes(shapes: dict[str, tuple[int, ...]]) -> str:
    return ",".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in shapes.items())


def with_input_shapes(spec: str, shapes: str | None) -> str:
    """``spec`` with its input shapes bound (the spec a manifest records and ``load_model`` reads)."""
    if not shapes:
        return spec
    spec, _ = _split_input_shapes(spec)  # the shapes given last replace any the spec named
    return f"{spec}{'&' if '?' in spec else '?'}{INPUT_SHAPES_KEY}={format_input_shapes(parse_input_shapes(shapes))}"


def bound_input_shapes(spec: str) -> dict[str, tuple[int, ...]] | None:
    """The input shapes ``spec`` binds, or None."""
    return _split_input_shapes(spec)[1]


def _split_input_shapes(spec: str) -> tuple[str, dict[str, tuple[int, ...]] | None]:
    """``spec`` without its ``input_shapes=`` parameter, and the shapes it gives."""
    if "?" not in spec or Path(spec).exists():
        return spec, None
    base, _, query = spec.partition("?")
    kept, shapes = [], None
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if key.strip() == INPUT_SHAPES_KEY:
            shapes = parse_input_shapes(value)
        else:
            kept.append(item)
    return (f"{base}?{'&'.join(kept)}" if kept else base), shapes


def bind_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], name: str) -> onnx.ModelProto:
    """A copy of ``model`` whose inputs have the given static shapes; the symbols they bind (``N``,
    ``batch``) are bound in the outputs and value infos too, and outputs still dynamic are inferred."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    graph = bound.graph
    initializers = {init.name for init in graph.initializer}
    inputs = {value.name: value for value in graph.input if value.name not in initializers}
    symbols: dict[str, int] = {}
    for input_name, shape in shapes.items():
        if input_name not in inputs:
            raise UserError(f"{name}: no input {input_name!r} (inputs: {', '.join(inputs)})")
        dims = inputs[input_name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise UserError(
                f"{name}: input {input_name!r} has {len(dims)} dimensions, --input-shapes gives {len(shape)}"
            )
        for index, (dim, size) in enumerate(zip(dims, shape, strict=True)):
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                raise UserError(
                    f"{name}: dimension {index} of input {input_name!r} is fixed at {dim.dim_value}, "
                    f"--input-shapes gives {size}"
                )
            if dim.HasField("dim_param") and dim.dim_param and symbols.setdefault(dim.dim_param, size) != size:
                raise UserError(
                    f"{name}: --input-shapes gives {dim.dim_param} both {symbols[dim.dim_param]} and {size}"
                )
            dim.dim_value = size  # replaces dim_param (one of the two)
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in symbols:
                dim.dim_value = symbols[dim.dim_param]
    if not all(d.HasField("dim_value") for value in graph.output for d in value.type.tensor_type.shape.dim):
        try:
            inferred = onnx.shape_inference.infer_shapes(bound, strict_mode=True, data_prop=True)
        except Exception as exc:  # noqa: BLE001 - onnx raises InferenceError, ValidationError, ...
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"{name}: cannot infer the output shapes from --input-shapes: {first}") from None
        graph.ClearField("output")
        graph.output.extend(inferred.graph.output)
    return bound


def read_inputs(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, by name; one-line errors for a missing or unreadable file."""
    if not Path(path).is_file():
        raise UserError(f"no such inputs file: {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except Exception as exc:  # noqa: BLE001 - numpy raises OSError, ValueError, BadZipFile, ...
        raise UserError(f"{path} is not an .npz file of arrays: {str(exc).splitlines()[0]}") from None


def check_inputs(model: LoadedModel, given: dict[str, np.ndarray], source: str = "--inputs") -> dict[str, np.ndarray]:
    """``given`` in the model's input order, each cast to its input's dtype; one-line errors for a missing
    or unknown name, another shape, or a dtype that does not cast safely."""
    specs = model.input_specs()
    names = [name for name, _, _ in specs]
    missing, unknown = [n for n in names if n not in given], [n for n in given if n not in names]
    if missing or unknown:
        raise UserError(
            f"{source} must hold one array per model input ({', '.join(names)}): "
            + "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"unknown {', '.join(unknown)}" if unknown else "",
                )
                if part
            )
        )
    inputs = {}
    for name, shape, dtype in specs:
        array = given[name]
        if tuple(array.shape) != tuple(shape):
            raise UserError(f"{source}: {name} has shape {tuple(array.shape)}, the model takes {tuple(shape)}")
        if not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise UserError(f"{source}: {name} is {array.dtype}, the model takes {dtype}")
        inputs[name] = np.ascontiguousarray(array.astype(dtype, copy=False))
    return inputs


def load_model(spec: str) -> LoadedModel:
    """Load ``spec``: an ONNX file path, or ``zoo:NAME[?key=value&...]``; either may end in
    ``?input_shapes=NAME:1x3x224x224,...`` (see :func:`bind_input_shapes`)."""
    spec, shapes = _split_input_shapes(spec)
    model = _load(spec)
    if shapes:
        model.onnx_model = bind_input_shapes(model.onnx_model, shapes, model.name)
    return model


def _load(spec: str) -> LoadedModel:
    if spec.startswith(ZOO_PREFIX):
        from . import zoo

        name, params = zoo.parse_spec(spec)
        return LoadedModel(spec[len(ZOO_PREFIX) :], zoo.build(name, **params))
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
    its legalization then fails, and some it cannot import at all (a Reshape of a computed shape). When
    the inputs are static and onnxruntime's constant folding resolves them, the folded graph is
    imported instead."""
    from tvm.relax.frontend.onnx import from_onnx

    from .quant.validate import check_quantization

    check_quantization(model.onnx_model, model.name)
    missing = unsupported_operators(model.onnx_model)
    if missing:
        raise UserError(f"{model.name}: unsupported ONNX operator(s) {', '.join(missing)} (TVM 0.27 Relax frontend)")
    try:
        # the importer prints the IR of an operator it fails on before raising; the folded graph is tried next
        with contextlib.redirect_stdout(io.StringIO()):
            mod = from_onnx(model.onnx_model, keep_params_in_input=False)
    except Exception as exc:
        if not _static_inputs(model):
            raise UserError(f"{model.name}: TVM could not import the model: {_first_line(exc)}") from None
        # a shape the importer cannot infer (Swin's window partition: Reshape of a computed shape), which
        # onnxruntime's folding resolves
        mod = None
    try:
        if mod is None or (computes_shapes(mod) and _static_inputs(model)):
            folded = from_onnx(fold_constants(model.onnx_model), keep_params_in_input=False)
            mod = folded if mod is None or not computes_shapes(folded) else mod
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{model.name}: TVM could not import the model: {_first_line(exc)}") from None
    return mod


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


_SHAPE_OPS = {"relax.shape_of", "relax.shape_to_tensor", "relax.tensor_to_shape"}


def computes_shapes(mod) -> bool:
    """Whether ``main`` has shape computations or tensors whose shapes are not constants."""
    from tvm import relax

    from .relax.ir_utils import op_name, static_shape, top_level_bindings

    for binding in top_level_bindings(mod["main"]):
        ty = binding.var.ty
        if op_name(binding.value) in _SHAPE_OPS:
            return True
        if isinstance(ty, relax.TensorType) and static_shape(ty) is None:
            return True
    return False


def _static_inputs(model: LoadedModel) -> bool:
    return not any(is_dynamic(shape) for _, shape, _ in model.input_specs())


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
            raise UserError(
                f"onnxruntime could not fold the graph's shape computations: {str(exc).splitlines()[0][:200]}"
            ) from None
        return onnx.load(options.optimized_model_filepath)
