"""The export-checking script end to end on a fixture (the full run is minutes per network)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_check_exports_splits_and_verifies_an_exported_stem(tmp_path):
    out = tmp_path / "exports.md"
    fixture = ROOT / "tests" / "fixtures" / "torchvision_mobilenet_v2_stem.torchscript.onnx"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_exports.py"), str(fixture), "--out", str(out),
                           "--search-seconds", "5", "--cache", str(tmp_path / "cache.jsonl")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [line for line in out.read_text().splitlines() if line.startswith("| torchvision_mobilenet_v2_stem")]
    checked = row.split("|")[9]
    assert checked.strip().startswith("yes,") and "= plan" in checked and "NOT" not in checked, row
