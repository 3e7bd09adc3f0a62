"""Export third-party networks (torchvision, timm, Hugging Face transformers) to ONNX, as users do.

    pip install -e ".[export]"          # torch, torchvision, timm, transformers, onnxscript
    python scripts/export_torch.py --out exports/                    # full networks, both exporters
    python scripts/export_torch.py --out exports/ --models mobilenet_v2 --exporter dynamo
    python scripts/export_torch.py --fixtures tests/fixtures/        # the small test fixtures

Weights are random (``weights=None``; nothing is downloaded): memory planning and splitting depend
on the graph, not on the values, and outputs are compared against onnxruntime on the same file.
Each network is exported with the TorchScript exporter (``dynamo=False``: BatchNormalization folded,
Constant nodes for Clip bounds, Identity nodes) and with the ``torch.export`` one (``dynamo=True``),
because the two write different graphs for the same network.

``--fixtures`` writes the stems of a few networks (their first blocks, where splitting acts) at
small sizes; the tests run the splitter on them without torch.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

Factory = Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]


def _image(resolution: int) -> tuple[torch.Tensor]:
    return (torch.randn(1, 3, resolution, resolution),)


def _torchvision(name: str, resolution: int = 224, **kwargs) -> Factory:
    def make():
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kwargs), _image(resolution)

    return make


def _timm(name: str, resolution: int = 224) -> Factory:
    def make():
        import timm

        return timm.create_model(name, pretrained=False), _image(resolution)

    return make


def _bert(
    layers: int = 2,
    hidden: int = 128,
    heads: int = 2,
    sequence: int = 128,
    vocab: int = 30522,
    positions: int = 512,
    pooled: bool = False,
) -> Factory:
    def make():
        from transformers import BertConfig, BertModel

        config = BertConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            vocab_size=vocab,
            max_position_embeddings=positions,
        )
        wrapper = _PooledEncoder if pooled else _Encoder
        return wrapper(BertModel(config, add_pooling_layer=pooled)), (torch.randint(0, vocab, (1, sequence)),)

    return make


class _Encoder(torch.nn.Module):
    """The last hidden state of a transformers model (its forward returns a dataclass)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).last_hidden_state


class _PooledEncoder(_Encoder):
    """Both outputs of a transformers encoder with its pooler, as ``BertModel`` exports them."""

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        output = self.model(input_ids=ids)
        return output.last_hidden_state, output.pooler_output


NETWORKS: dict[str, Factory] = {
    "mobilenet_v2": _torchvision("mobilenet_v2"),
    # the microcontroller-sized MobileNetV2 that MCUNet, TinyEngine and X-CUBE-AI publish figures for
    "mobilenet_v2_035": _torchvision("mobilenet_v2", 144, width_mult=0.35),
    "mobilenet_v3_small": _torchvision("mobilenet_v3_small"),
    "efficientnet_b0": _torchvision("efficientnet_b0"),
    "mnasnet1_0": _torchvision("mnasnet1_0"),
    "shufflenet_v2_x1_0": _torchvision("shufflenet_v2_x1_0"),
    "squeezenet1_0": _torchvision("squeezenet1_0"),
    "googlenet": _torchvision("googlenet", aux_logits=False, init_weights=True),
    "inception_v3": _torchvision("inception_v3", 299, aux_logits=False, init_weights=True),
    "densenet121": _torchvision("densenet121"),
    "resnet18": _torchvision("resnet18"),
    "resnet50": _torchvision("resnet50"),
    "resnext50_32x4d": _torchvision("resnext50_32x4d"),
    "timm_mobilenetv3_large_100": _timm("mobilenetv3_large_100"),
    "timm_efficientnet_lite0": _timm("efficientnet_lite0"),
    "hf_bert_tiny": _bert(),
    # beyond the parity issue's list: transformers on 197 tokens, windowed attention, LayerNorm and GELU
    # convolution blocks, grouped convolutions with squeeze-and-excitation, a mobile vision transformer
    "vit_b_16": _torchvision("vit_b_16"),
    "swin_t": _torchvision("swin_t"),
    "convnext_tiny": _torchvision("convnext_tiny"),
    "regnet_y_400mf": _torchvision("regnet_y_400mf"),
    "efficientnet_v2_s": _torchvision("efficientnet_v2_s"),
    "mobilenet_v3_large": _torchvision("mobilenet_v3_large"),
    "timm_mobilevit_s": _timm("mobilevit_s"),
    "timm_ghostnet_100": _timm("ghostnet_100"),
}


class _Stem(torch.nn.Module):
    """The first ``count`` children of a torchvision ``features`` sequence."""

    def __init__(self, features: torch.nn.Sequential, count: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(*list(features.children())[:count])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _stem(name: str, count: int, resolution: int, **kwargs) -> Factory:
    def make():
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, **kwargs)
        return _Stem(model.features, count), _image(resolution)

    return make


def _shufflenet_unit() -> Factory:
    def make():
        from torchvision.models.shufflenetv2 import InvertedResidual

        return InvertedResidual(48, 48, 1), (torch.randn(1, 48, 12, 12),)

    return make


FIXTURES: dict[str, Factory] = {
    "torchvision_mobilenet_v2_stem": _stem("mobilenet_v2", 4, 48, width_mult=0.5),
    "torchvision_squeezenet1_0_stem": _stem("squeezenet1_0", 5, 48),
    "torchvision_efficientnet_b0_stem": _stem("efficientnet_b0", 3, 48),
    # x.chunk(2) and the channel shuffle: the TorchScript exporter computes the chunk sizes at run time
    "torchvision_shufflenet_v2_unit": _shufflenet_unit(),
    # attention as transformers writes it (the dynamo exporter adds a NaN guard after the softmax)
    "transformers_bert_layer": _bert(layers=1, hidden=32, heads=2, sequence=16, vocab=64, positions=16),
    # two outputs (last_hidden_state, pooler_output), as BertModel's default export has
    "transformers_bert_pooled": _bert(layers=1, hidden=32, heads=2, sequence=16, vocab=64, positions=16, pooled=True),
}


def export(factory: Factory, path: Path, dynamo: bool) -> None:
    """Write ``path`` atomically: a failed export leaves no half-written file behind."""
    model, inputs = factory()
    model.eval()
    # eval mode without gradients sends torch.nn.MultiheadAttention (torchvision's ViT) to a fused kernel that
    # has no ONNX export; the exporters need its decomposition
    torch.backends.mha.set_fastpath_enabled(False)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        scratch = Path(tmp) / path.name
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if dynamo:
                program = torch.onnx.export(
                    model, inputs, dynamo=True, opset_version=18, external_data=False, verbose=False
                )
                program.save(str(scratch), external_data=False)
            else:
                torch.onnx.export(model, inputs, str(scratch), dynamo=False, opset_version=17)
        _repo_relative_traces(scratch)
        scratch.replace(path)


REPO = Path(__file__).resolve().parents[1]


def _repo_relative_traces(path: Path) -> None:
    """The dynamo exporter records each node's Python stack trace with absolute file names: keep this
    repository's files relative to it, so an export names no folder of the machine that made it."""
    import onnx

    model = onnx.load(str(path))
    changed = False
    for node in model.graph.node:
        for prop in node.metadata_props:
            if str(REPO) + "/" in prop.value:
                prop.value = prop.value.replace(str(REPO) + "/", "")
                changed = True
    if changed:
        onnx.save(model, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for full networks")
    parser.add_argument("--fixtures", type=Path, help="folder for the small test fixtures")
    parser.add_argument("--models", nargs="*", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--fixture-names", nargs="*", default=list(FIXTURES), help="which fixtures to write")
    parser.add_argument("--exporter", choices=["torchscript", "dynamo", "both"], default="both")
    args = parser.parse_args()
    exporters = ["torchscript", "dynamo"] if args.exporter == "both" else [args.exporter]
    torch.manual_seed(0)
    if args.fixtures:
        for name in args.fixture_names:
            factory = FIXTURES[name]
            for exporter in ("torchscript", "dynamo"):
                path = args.fixtures / f"{name}.{exporter}.onnx"
                export(factory, path, dynamo=exporter == "dynamo")
                print(path)
    if args.out:
        for name in args.models:
            for exporter in exporters:
                path = args.out / f"{name}.{exporter}.onnx"
                try:
                    export(NETWORKS[name], path, dynamo=exporter == "dynamo")
                    print(path)
                except Exception as exc:  # noqa: BLE001 - one line per network that the exporter refuses
                    print(f"{path}: export failed: {str(exc).splitlines()[0][:200]}")


if __name__ == "__main__":
    main()
