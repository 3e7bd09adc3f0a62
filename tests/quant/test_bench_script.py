"""scripts/bench_int8.py end to end on the smallest zoo network (the full table takes minutes)."""

from tests.script_runner import run_script


def test_bench_int8_writes_a_row_with_a_quarter_arena(tmp_path):
    """Built for an AVX2 CPU (Haswell), as the bench times AVX2 kernels on an AVX-512 machine."""
    out = tmp_path / "bench_int8.md"
    run_script(
        "bench_int8.py",
        *("zoo:mcu_cnn", "--inputs", "2", "--order-seconds", "2", "--mcpu", "haswell", "--out", str(out)),
    )
    assert "LLVM CPU `haswell`, 8 float32 lanes, int8 convolutions with avx2" in out.read_text()
    (row,) = [line for line in out.read_text().splitlines() if line.startswith("| zoo:mcu_cnn")]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    float_arena, int8_arena, bound = (int(c.replace(",", "")) for c in cells[1:4])
    assert int8_arena == bound and int8_arena < float_arena / 3
    built_float, built_int8 = (int(c.replace(",", "")) for c in cells[6].split(" → "))
    assert built_int8 < built_float / 2 and "int8" in cells[8] and "int32" in cells[8]
    assert cells[9] == "0" and cells[10] == "yes"
    lsb, spread = cells[14].replace("(", "").replace(")", "").split()
    assert int(lsb) <= max(2, int(spread))
    ours, onnxruntime_unoptimized, _of, inputs = cells[15].replace("/", " ").split()[:4]
    assert inputs == "2" and int(ours) >= int(onnxruntime_unoptimized)
