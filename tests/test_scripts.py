"""The export-checking script end to end on a fixture (the full run is minutes per network)."""

import os
import shutil

import pytest

from tests.script_runner import ROOT, run_script

RESULTS_README = ROOT / "results" / "README.md"
needs_arm = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None,
    reason="arm-none-eabi-gcc or qemu-system-arm missing (.ci/run installs them)",
)


def test_check_exports_splits_and_verifies_an_exported_stem(tmp_path):
    out = tmp_path / "exports.md"
    fixture = ROOT / "tests" / "fixtures" / "torchvision_mobilenet_v2_stem.torchscript.onnx"
    run_script(
        "check_exports.py",
        str(fixture),
        "--out",
        str(out),
        "--search-seconds",
        "5",
        "--cache",
        str(tmp_path / "cache.jsonl"),
    )
    (row,) = [line for line in out.read_text().splitlines() if line.startswith("| torchvision_mobilenet_v2_stem")]
    checked = row.split("|")[9]
    assert checked.strip().startswith("yes,") and "= plan" in checked and "NOT" not in checked, row


def test_profile_split_reports_a_chain_unsplit_and_in_tiles(tmp_path):
    """The profile of mcu_cnn's stem chain in 2 and 4 row tiles: launches grow with the tiles, the
    reduction steps cannot shrink (halos are recomputed), the simulated peak drops; fused, the
    chain is one launch."""
    out = tmp_path / "profile.md"
    run_script(
        "profile_split.py",
        "zoo:mcu_cnn",
        "--chains",
        "lv..lv4 (rows)",
        "--parts",
        "2,4",
        "--rounds",
        "1",
        "--out",
        str(out),
    )
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| ") and "---" not in line][1:]
    unsplit, *tiles = rows
    assert [int(r[2]) for r in tiles] == [2, 4]
    peak, launches, steps = float(unsplit[3]), int(unsplit[4]), float(unsplit[5])
    assert all(float(r[3]) < peak and int(r[4]) > launches and float(r[5].split()[0]) >= steps for r in tiles)
    assert all("/" in r[6] and "/" in r[7] for r in tiles)  # both timed, side by side
    # the chain's tiles as one kernel: one launch, timed in the same rounds
    assert all(int(r[8]) == 1 and "(" in r[9] and "(" in r[10] for r in tiles)
    # halos kept in a line buffer: timed where a worker runs more than one tile, with its simulated peak
    assert all(("(" in r[13] and "[" in r[13]) or r[13].strip() == "no halo" for r in tiles)


def test_time_fused_chain_compiles_and_times_the_fused_tiles(tmp_path):
    """mcu_cnn's stem chain in 2 and 4 fused tiles: compiled, bit-identical to the unsplit chain, timed
    beside it; a second run under another label (and in NCHW) adds its rows to the same table."""
    out = tmp_path / "fused.md"
    for label, extra in (("a", []), ("b", ["--append", "--layout", "nchw"])):
        run_script(
            "time_fused_chain.py", "zoo:mcu_cnn", "--chain", "lv..lv4 (rows)", "--parts", "2,4", "--rounds", "1",
            "--label", label, "--out", str(out), *extra,
        )  # fmt: skip
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert {r[1].strip() for r in rows} == {"a", "b"} and {int(r[3]) for r in rows} == {2, 4}
    assert {r[2].strip() for r in rows if r[1].strip() == "b"} == {"NCHW"}
    assert all(r[2].strip().startswith("NCHW") for r in rows)  # "auto": NCHW[x]c where vectors hold a block
    assert all(float(r[5]) > 0 and r[6].strip() == "yes" and "(" in r[8] for r in rows)
    bad_parts = run_script(
        "time_fused_chain.py", "zoo:mcu_cnn", "--chain", "lv..lv4 (rows)", "--parts", "1,x", returncode=2
    )
    no_chain = run_script("time_fused_chain.py", "zoo:mcu_cnn", "--chain", "lv9..lv1", returncode=1)
    assert bad_parts.stderr.count("\n") == 1 and "--parts" in bad_parts.stderr
    assert no_chain.stderr.strip().splitlines()[-1].startswith("error: no chain 'lv9..lv1'")


def test_published_memory_tables_match_what_the_script_plans_now():
    """Memory is deterministic: a change that moves a zoo model's arena, bound, in-place count or order
    must regenerate the published tables (scripts/bench_memory.py) or this fails."""
    run_script("bench_memory.py", "--zoo", "--check", str(RESULTS_README), timeout=900)


def test_the_readme_check_sees_a_stale_row(tmp_path):
    """The check itself: one changed figure in a copy of the results page is reported, exit 1."""
    readme = RESULTS_README.read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| mlp | 0.00 | 0.00 | +0.0%"))
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace(row, row.replace("| program (proved optimal) |", "| beam1 |")))
    done = run_script("bench_memory.py", "--zoo", "mlp", "--check", str(stale), returncode=1)
    assert "stale or missing row" in done.stderr and "| mlp |" in done.stderr


def test_plot_results_draws_the_charts_from_the_tables(tmp_path):
    run_script(
        "plot_results.py",
        "--out",
        str(tmp_path),
        "--layout-model",
        "zoo:mcu_cnn",
    )
    for name in ("memory.png", "latency.png", "parity.png", "parity_avx2.png", "memory_layout_mcu_cnn.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_execute_tutorials_stores_the_outputs(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    notebook = tmp_path / "tiny.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("print(6 * 7)")]), notebook)
    run_script("execute_tutorials.py", str(notebook), timeout=300)
    (cell,) = nbformat.read(notebook, as_version=4).cells
    assert cell.outputs[0]["text"] == "42\n"


def test_bench_latency_default_only_times_the_default_build_against_onnxruntime(tmp_path):
    out = tmp_path / "latency.md"
    run_script(
        "bench_latency.py",
        *("zoo:mcu_cnn", "--default-only", "--rounds", "1", "--repeat", "1"),
        *("--out", str(out), "--log", str(tmp_path / "log.jsonl")),
    )
    text = out.read_text()
    (row,) = [line.split("|") for line in text.splitlines() if line.startswith("| zoo:mcu_cnn")]
    ratio = float(row[4].strip().removesuffix("x"))
    assert ratio > 0 and row[-3].strip() == "yes" and row[-2].strip() == "yes"
    assert f"Median memplan / onnxruntime over 1 models: {ratio:.2f}x" in text


def test_bench_latency_times_the_blocked_layout_and_an_earlier_build_beside_nchw(tmp_path):
    from tvm_memplan.cli.main import main as cli

    out, earlier = tmp_path / "latency.md", tmp_path / "earlier"
    # this checkout's builds stand in for an earlier checkout's
    for pipeline, layout in (("memplan", "nchw"), ("memplan_blocked", "blocked")):
        assert cli(["build", "zoo:mcu_cnn", "--layout", layout, "-o", str(earlier / f"zoo_mcu_cnn.{pipeline}.so")]) == 0
    run_script(
        "bench_latency.py",
        "zoo:mcu_cnn",
        "--blocked",
        "--rounds",
        "1",
        "--repeat",
        "1",
        "--out",
        str(out),
        "--log",
        str(tmp_path / "log.jsonl"),
        "--baseline",
        str(earlier),
    )
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| zoo:mcu_cnn")]
    assert len(rows) == 4  # the NCHW table's row, the blocked table's, and NCHW and blocked against the earlier build
    blocked = rows[1]
    assert float(blocked[4].split()[0]) > 0 and blocked[-3].strip() == "yes" and blocked[-2].strip() == "yes"
    assert [row[2].strip() for row in rows[2:]] == ["NCHW", "blocked"]
    assert all(float(row[4].split()[0]) > 0 and row[-3].strip() == "yes" for row in rows[2:])
    assert all(row[-2].strip() == "yes, yes" for row in rows[2:])  # correct, earlier and now


def test_profile_kernels_times_each_kernel_of_an_int8_model(tmp_path):
    """mcu_cnn quantized: every kernel is listed with its calls, the shares add up to the total,
    and where this CPU has a dot-product instruction the regular convolutions use it and the
    depthwise ones int32 vectors."""
    import tvm

    from tvm_memplan.schedule.cpu import cpu_spec

    out = tmp_path / "profile.md"
    run_script("profile_kernels.py", "zoo:mcu_cnn", "--int8", "--out", str(out))
    text = out.read_text()
    shares = [float(line.split("|")[4].strip(" %")) for line in text.splitlines() if line.endswith("% |")]
    assert abs(sum(shares) - 100) < 1 and any(line.startswith("| qdepthwise_conv2d |") for line in text.splitlines())
    dot = cpu_spec(tvm.target.Target.from_device("cpu")).int8_dot
    rows = [line.split("|") for line in text.splitlines() if line.count("|") == 6]  # the kernels one by one
    paths = {row[1].strip(): row[4].strip() for row in rows}
    assert paths["qconv2d1"] == ("dot product" if dot else "no")
    assert paths["qdepthwise_conv2d"] == ("int32 vectors" if dot else "no")


def test_profile_kernels_profiles_the_blocked_layout(tmp_path):
    """--layout blocked profiles the kernels the blocked pipeline builds: NCHW[x]c convolutions where this
    CPU's vectors hold 4 or more float32 lanes."""
    import tvm

    from tvm_memplan.relax.layout import layout_block

    out = tmp_path / "profile.md"
    run_script("profile_kernels.py", "zoo:mcu_cnn", "--layout", "blocked", "--out", str(out))
    text = out.read_text()
    assert "(blocked)" in text.splitlines()[0]
    blocked = any(line.startswith("| fused_conv2d_nchwc") for line in text.splitlines())
    assert blocked == (layout_block(tvm.target.Target.from_device("cpu"), "blocked") is not None)


def test_profile_kernels_takes_a_target_such_as_avx2_kernels_on_an_avx512_host(tmp_path):
    out = tmp_path / "profile.md"
    target = '{"kind": "llvm", "mcpu": "x86-64"}'  # baseline x86-64 (SSE2): runs on any x86-64 host
    run_script("profile_kernels.py", "zoo:mcu_cnn", "--layout", "blocked", "--target", target, "--out", str(out))
    text = out.read_text()
    assert "(blocked, x86-64)" in text.splitlines()[0]
    assert any(line.startswith("| fused_conv2d") for line in text.splitlines())


def test_profile_kernels_in_cpu_time_on_rotated_arguments(tmp_path):
    """--cpu-time --rotate-mib: each kernel timed in process CPU time on copies of its arguments; the table
    says so and its shares add up."""
    out = tmp_path / "profile.md"
    run_script(
        "profile_kernels.py", "zoo:mcu_cnn", "--layout", "blocked", "--cpu-time", "--rotate-mib", "1", "--out", str(out)
    )
    text = out.read_text()
    assert "process CPU time, arguments rotated over 1 MiB" in text
    shares = [float(line.split("|")[4].strip(" %")) for line in text.splitlines() if line.endswith("% |")]
    assert shares and abs(sum(shares) - 100) < 1


def test_profile_mcu_counts_each_kernel_on_the_emulated_m7(tmp_path):
    """mcu_cnn quantized on the emulated Cortex-M7: the calls' instructions add up to the whole run's,
    the outputs agree with onnxruntime, and each whole-layer C kernel has a floor below what it retires."""
    import shutil

    import pytest

    if shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None:
        pytest.skip("no arm-none-eabi-gcc or qemu-system-arm")
    out = tmp_path / "profile.md"
    run_script("profile_mcu.py", "--model", "zoo:mcu_cnn", "--out", str(out))
    text = out.read_text()
    assert "outputs agree with onnxruntime" in text
    whole = float(text.split("Whole run: ")[1].split(" M instructions")[0])
    calls = [
        line.split("|") for line in text.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    ]
    assert abs(sum(float(call[3].replace(",", "")) for call in calls) / 1e3 - whole) < 0.1 + 0.02 * whole
    floors = [float(call[8]) for call in calls if call[8].strip() != "-"]
    assert floors and all(ratio > 1 for ratio in floors)


def test_bench_mcu_gives_a_models_float_int8_and_fixed_point_rows_on_the_m7(tmp_path):
    """``bench_mcu.py --model`` (mcu_cnn here, a torchvision export for the table) with its float32, int8 and
    fixed-point rows: each planned arena is what the ELF holds, the int8 ones agree with onnxruntime, and the int8
    instructions are a ratio of the float row's below 1."""
    import shutil

    import pytest

    if shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None:
        pytest.skip("no arm-none-eabi-gcc or qemu-system-arm")
    out = tmp_path / "mcu.md"
    run_script("bench_mcu.py", "--model", "zoo:mcu_cnn", "--rows", "13,14,17", "--out", str(out))
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| mcu_cnn")]
    assert [row[2].strip() for row in rows] == ["float32", "int8", "int8"], rows
    assert all(row[5].strip() == "yes" for row in rows)  # = plan
    assert "--requantize fixed" in rows[2][1]
    ratios = [float(row[18]) for row in rows[1:]]
    assert all(0 < ratio < 1 for ratio in ratios), ratios
    assert "LSB (≤" in rows[2][19] and "NO" not in rows[2][19]
    flash, weights, code = (float(row[i].strip().replace(",", "")) for row in rows[:1] for i in (13, 14, 15))
    assert abs(flash - weights - code) <= 0.1  # code: what flash holds besides the weights
    assert all(row[22].strip() == "-" for row in rows)  # published figures are for MobileNetV2-w0.35 only


def test_bench_mcu_m55_compares_helium_with_the_smlad_kernels_on_the_same_c(tmp_path):
    """mcu_cnn quantized on the emulated Cortex-M55, built with and without MVE: both runs agree with
    onnxruntime and with each other byte for byte, and the table has the pointwise families."""
    import shutil

    import pytest

    if shutil.which("arm-none-eabi-gcc") is None or shutil.which("qemu-system-arm") is None:
        pytest.skip("no arm-none-eabi-gcc or qemu-system-arm")
    out = tmp_path / "m55.md"
    run_script("bench_mcu_m55.py", "--model", "zoo:mcu_cnn", "--out", str(out))
    text = out.read_text()
    assert "identical byte for byte; against onnxruntime: agree" in text and "DO NOT" not in text
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in text.splitlines() if line.startswith("| q")}
    assert {"qconv2d", "qconv2d_add", "qdense"} <= set(rows)


def test_bench_gpu_keeps_going_past_a_failed_model_and_names_software_devices(tmp_path):
    """bench_gpu.py on this CPU (the GPU targets need a device): a model that fails is a FAILED row and the
    next is still measured; its header tells software devices (PoCL, lavapipe) from a GPU."""
    import importlib.util

    out = tmp_path / "bench_gpu.md"
    missing = tmp_path / "missing.onnx"
    args = ["--targets", "host", "--dlight-models", "--kernels", "", "--rounds", "1", "--repeat", "1"]
    done = run_script(
        "bench_gpu.py", str(missing), "zoo:mcu_cnn", *args, "--min-repeat-ms", "1", "--out", str(out), returncode=1
    )
    assert done.stderr.strip().endswith("failed: missing.onnx on host"), done.stderr[-2000:]
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert rows[0][1].strip() == "missing.onnx" and "FAILED: no such model file" in rows[0][3]
    assert [(r[1].strip(), r[3].strip()) for r in rows[1:]] == [("mcu_cnn", "stock"), ("mcu_cnn", "memplan")]
    assert all(r[9].strip() == "yes" and r[11].strip() == "yes" for r in rows[1:])  # requested = plan, correct

    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "scripts" / "bench_gpu.py")
    bench_gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_gpu)
    note = bench_gpu.devices_note(["opencl: pthread-haswell-AMD EPYC", "cuda: NVIDIA H200 (sm_90, 140 GiB)"])
    software, gpu = note.split("**")[1], note.split("**")[3]
    assert "opencl" in software and "PoCL" in software and "cuda" not in software
    assert gpu == "cuda: NVIDIA H200 (sm_90, 140 GiB): a GPU."
    assert bench_gpu.devices_note(["llvm: x86_64"]) == ""


def _table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the Markdown table under ``heading``."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_bench_mcu_split_floor_names_what_holds_it(tmp_path):
    """The simulator's splitting floor of an int8 MobileNetV2 stem: below the unsplit peak, with the tensors that
    hold it; chains of 9 windows tile the tensor that 6-window chains leave whole, and the device search's
    line buffer (first row) goes below the floors of tiles that recompute their halos."""
    out = tmp_path / "floor.md"
    fixture = ROOT / "tests" / "fixtures" / "torchvision_mobilenet_v2_stem.torchscript.onnx"
    run_script("bench_mcu_split.py", str(fixture), "--out", str(out), "--floor-only", "--floor-seconds", "60")
    text = out.read_text()
    unsplit = float(text.split("Unsplit, the simulated peak is ", 1)[1].split(" KiB")[0].replace(",", ""))
    rows = _table_rows(text, "## The splitting floor")
    assert [(r[0], r[1]) for r in rows] == [("12", "64"), ("6", "16"), ("6", "64"), ("9", "16"), ("9", "64")]
    assert [r[2] for r in rows] == ["line buffer or recomputed"] + ["recomputed"] * 4
    floors = {(r[0], r[1]): float(r[3].split()[0].replace(",", "")) for r in rows}
    assert all(value < unsplit for value in floors.values())
    assert all(r[5] != "none" and "KiB" in r[6] for r in rows)
    recomputed = rows[1][6]
    whole = [part for part in recomputed.split("; ") if not part.startswith("tile ")]
    assert whole and whole[0].split(" (")[0] not in rows[3][6]  # left whole at 6 windows, tiled at 9
    assert floors[("9", "16")] < floors[("6", "16")]
    assert floors[("12", "64")] < min(v for k, v in floors.items() if k != ("12", "64"))
    assert "line buffer" in rows[0][5] and "What holds it: tile " in text


@pytest.mark.slow
@needs_arm
def test_bench_mcu_split_builds_the_kept_plan_on_the_emulated_m7(tmp_path):
    """Split to fit 8 KiB (mcu_cnn's int8 arena is 10 KiB): the split builds' arenas are smaller, outputs agree."""
    out = tmp_path / "split.md"
    run_script(
        "bench_mcu_split.py", "zoo:mcu_cnn", "--out", str(out), "--search-seconds", "5", "--memory-limit", "8",
        "--no-floor", "--split-cache", str(tmp_path / "cache.jsonl"),
    )  # fmt: skip
    text = out.read_text()
    assert "## The splitting floor" not in text and "--memory-limit 8K" in text
    rows = _table_rows(text, "## Builds on the emulated core")
    assert [(r[0], r[1]) for r in rows] == [
        ("unsplit", "excluded"), ("unsplit", "in arena"), ("split", "excluded"), ("split", "in arena")
    ]  # fmt: skip
    assert all(r[3] == "yes" and "NO" not in r[10] for r in rows)  # arena = plan, outputs agree
    assert [r[9] for r in rows[:2]] == ["-", "-"] and all(r[9].endswith("%") for r in rows[2:])
    arena = {(r[0], r[1]): float(r[2]) for r in rows}
    assert arena[("split", "excluded")] <= 8 < arena[("unsplit", "excluded")]


def test_bench_split_reports_the_floor_and_what_holds_a_missed_target(tmp_path):
    """mcu_cnn with a target it cannot reach: the row has the simulator's floor, each split chain says
    whether it runs fused, and the target column names the floor and the chain holding the kept plan
    above it with its measured cost each way its tiles can run; the command that made the table is in its text."""
    out = tmp_path / "split.md"
    args = ["zoo:mcu_cnn", "--search-seconds", "2", "--order-seconds", "1", "--floor-seconds", "2"]
    run_script("bench_split.py", *args, "--target", "mcu_cnn=100", "--fused-tiles", "auto", "--out", str(out))
    text = out.read_text()
    header, row = [line for line in text.splitlines() if line.startswith("| ")][:2]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")], strict=True))
    floor = float(cells["floor (simulated)"].split("x")[0])
    assert floor >= float(cells["reduction"].rstrip("x")) * 0.5 and floor > 1.0
    assert cells["target"].startswith("100x: missed; floor") and "held by" in cells["target"]
    assert "ms (" in cells["target"] and cells["correct, VM = plan"] == "yes"
    # each way the holding chain's tiles can run: its measured cost and the floor plan's reduction with it
    ways = cells["target"].split("(budget 5%): ", 1)[1].split("; ")
    assert ways[0].startswith("as the floor plan runs it") and len(ways) >= 2
    assert all(" ms (" in way and way.endswith("x") for way in ways)
    assert any(way.startswith("fused") for way in ways[1:])
    # the whole floor plan built and timed against the unsplit model, with its simulated reduction
    built = cells["floor plan built: overhead, reduction"].split("; ")
    assert built[0].startswith("as the floor plan runs its tiles: ")
    assert float(built[0].rsplit(", ", 1)[1].rstrip("x")) == pytest.approx(floor, abs=0.01)
    assert all(way.endswith("x") and "%, " in way for way in built)
    assert cells["layout"].startswith("NCHW")  # the layout the plans are built and timed in
    split = cells["chains found / split"].split(" / ", 1)[1]
    assert split == "none" or all(c.endswith(("fused", "fused, line buffer", "per-kernel")) for c in split.split("; "))
    command = text.split("Command: `", 1)[1]  # (after TVM_NUM_THREADS=N where the caller set it)
    assert "python scripts/bench_split.py zoo:mcu_cnn " in command.split("`")[0]


def test_bench_cpu_time_times_built_artifacts_against_onnxruntime_at_one_thread(tmp_path):
    from tvm_memplan.cli.main import main

    artifact = tmp_path / "mcu_cnn.so"
    assert main(["build", "zoo:mcu_cnn", "-o", str(artifact)]) == 0
    env = {**os.environ, "TVM_NUM_THREADS": "2"}
    refused = run_script("bench_cpu_time.py", "zoo:mcu_cnn", "--artifact", f"a={artifact}", env=env, returncode=2)
    assert "TVM_NUM_THREADS=1" in refused.stderr  # CPU time is one thread's only at one
    out = tmp_path / "cpu_time.md"
    env["TVM_NUM_THREADS"] = "1"
    missing = run_script(
        "bench_cpu_time.py", str(tmp_path / "missing.onnx"), "--artifact", f"a={artifact}", env=env, returncode=2
    )
    assert missing.stderr.strip() == f"error: no such model file: {tmp_path / 'missing.onnx'}"
    run_script(
        "bench_cpu_time.py",
        *("zoo:mcu_cnn", "--artifact", f"before={artifact}", "--artifact", f"after={artifact}"),
        *("--rounds", "2", "--repeat", "2", "--out", str(out)),
        env=env,
    )
    (row,) = [line for line in out.read_text().splitlines() if line.startswith("| zoo:mcu_cnn")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert len(cells) == 7 and all(float(cells[i]) > 0 for i in (1, 2, 4))
    assert float(cells[-1]) < 1e-4  # the build computes what onnxruntime does


def test_bench_compile_time_times_two_checkouts_side_by_side(tmp_path):
    out = tmp_path / "compile.md"
    run_script("bench_compile_time.py", "zoo:mcu_cnn", "--baseline-src", str(ROOT), "--repeat", "1", "--out", str(out))
    (row,) = [line for line in out.read_text().splitlines() if line.startswith("| zoo:mcu_cnn")]
    baseline_s, current_s, ratio = (cell.strip() for cell in row.strip("|").split("|")[1:])
    assert float(baseline_s) > 0 and float(current_s) > 0
    assert ratio.endswith("x") and float(ratio.removesuffix("x")) > 0 and "Median ratio" in out.read_text()
    refused = run_script("bench_compile_time.py", "zoo:mcu_cnn", "--baseline-src", str(tmp_path), returncode=1)
    assert refused.stderr.count("\n") == 1 and "not a checkout of tvm_memplan" in refused.stderr


def test_bench_simulator_layout_puts_simulated_peaks_beside_planned_arenas(tmp_path):
    out = tmp_path / "simulator.md"
    run_script("bench_simulator_layout.py", "zoo:mcu_cnn", "--splits", "1", "--order-seconds", "1", "--out", str(out))
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| mcu_cnn")]
    assert len(rows) == 2 and rows[0][1].strip().startswith("unsplit (NCHW")
    for row in rows:  # the blocked sizes are the planner's, within a few percent
        simulated, planned = (int(cell.replace(",", "")) for cell in row[3:5])
        assert abs(planned - simulated) <= 0.07 * simulated


def test_time_parallel_regions_times_launches_barriers_and_serial_stages_alike(tmp_path):
    """The three ways of running a tile's stages give the same tensor (the script checks) and one table row per
    stage size, each with the three times and the per-stage differences against serial."""
    out = tmp_path / "regions.md"
    args = ["--tiles", "2", "--stages", "3", "--rows", "4,8", "--cols", "16", "--number", "3", "--repeat", "2"]
    run_script("time_parallel_regions.py", *args, "--out", str(out), env={**os.environ, "TVM_NUM_THREADS": "2"})
    rows = _table_rows(out.read_text(), "## Parallel stages")
    assert [r[0] for r in rows] == ["4", "8"]
    assert all(float(cell) > 0 for r in rows for cell in r[2:5])
    assert "6 parallel loops" in out.read_text() and "TVM_NUM_THREADS=2" in out.read_text()


CPUID_HARNESS = r"""
#include "cpuid_without_avx512.c"
int main(void) {
    static const unsigned char instruction[2] = {0x0f, 0xa2};
    const uint32_t leaves[][2] = {{0, 0}, {7, 0}, {7, 1}, {0xd, 0}};
    for (int i = 0; i < 4; i++) {
        ucontext_t uc;
        memset(&uc, 0, sizeof uc);
        greg_t *regs = uc.uc_mcontext.gregs;
        regs[REG_RIP] = (greg_t)instruction;
        regs[REG_RAX] = leaves[i][0];
        regs[REG_RCX] = leaves[i][1];
        siginfo_t info = {.si_code = SI_KERNEL};
        answer_cpuid(SIGSEGV, &info, &uc);
        uint32_t a, b, c, d;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(leaves[i][0]), "c"(leaves[i][1]));
        printf("%u %u %u %u %u %u %u %u %u %u %ld\n", leaves[i][0], leaves[i][1], a, b, c, d, (uint32_t)regs[REG_RAX],
               (uint32_t)regs[REG_RBX], (uint32_t)regs[REG_RCX], (uint32_t)regs[REG_RDX],
               (long)(regs[REG_RIP] - (greg_t)instruction));
    }
    return 0;
}
"""
x86_linux = pytest.mark.skipif(
    os.uname().machine != "x86_64" or shutil.which("cc") is None, reason="CPUID masking is for x86-64 Linux with cc"
)


@x86_linux
def test_cpuid_without_avx512_clears_avx512_and_keeps_avx2(tmp_path):
    """The SIGSEGV handler's answer, on a made-up CPUID fault: real values, AVX-512/AMX bits cleared, RIP past it."""
    import subprocess

    (tmp_path / "harness.c").write_text(CPUID_HARNESS)
    binary = tmp_path / "harness"
    # The library's constructor (which would turn faulting on, or exit where there is none) is left out.
    subprocess.run(
        ["cc", "-O2", "-Dconstructor=unused", f"-I{ROOT / 'scripts'}", "-o", str(binary), str(tmp_path / "harness.c")],
        check=True,
    )
    rows = [list(map(int, line.split())) for line in subprocess.check_output([str(binary)], text=True).splitlines()]
    answers = {(row[0], row[1]): (row[2:6], row[6:10], row[10]) for row in rows}
    assert all(advanced == 2 for _, _, advanced in answers.values())
    real, masked, _ = answers[(0, 0)]
    assert masked == real
    real, masked, _ = answers[(7, 0)]
    avx512_ebx = sum(1 << bit for bit in (16, 17, 21, 26, 27, 28, 30, 31))
    assert masked[1] == real[1] & ~avx512_ebx & 0xFFFFFFFF
    assert masked[1] & (1 << 5) == real[1] & (1 << 5)  # AVX2 stays
    assert masked[2] & (1 << 11) == 0 and masked[3] & (1 << 23) == 0  # AVX512-VNNI, AVX512-FP16
    assert masked[0] == real[0]
    real, masked, _ = answers[(0xD, 0)]
    assert masked[0] & 0xE0 == 0 and masked[0] & 0x7 == real[0] & 0x7  # ZMM state gone, x87/SSE/AVX kept


@x86_linux
def test_cpuid_without_avx512_hides_avx512_from_numpy_or_says_why_not(tmp_path):
    """Preloaded: numpy (which reads CPUID as MLAS does) sees AVX2 only; on a machine without CPUID faulting the
    process stops with one line and status 2 rather than run unmasked."""
    import subprocess
    import sys

    library = tmp_path / "cpuid_without_avx512.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O2", "-o", str(library), str(ROOT / "scripts" / "cpuid_without_avx512.c")],
        check=True,
    )
    probe = "from numpy._core._multiarray_umath import __cpu_features__ as f; print(f['AVX512F'], f['AVX2'])"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "LD_PRELOAD": str(library)},
        capture_output=True,
        text=True,
        check=False,
    )
    flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    if "cpuid_fault" in flags:
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["False", str("avx2" in flags)]
    else:
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and "no CPUID faulting" in done.stderr


def test_bench_latency_as_avx2_wants_an_avx2_target(tmp_path):
    done = run_script(
        "bench_latency.py",
        *("zoo:mcu_cnn", "--default-only", "--as-avx2", "--target", '{"kind":"llvm","mcpu":"znver4"}'),
        *("--out", str(tmp_path / "latency.md")),
        returncode=2,
    )
    assert "name an AVX2 CPU in --target" in done.stderr


def test_profile_onnxruntime_lists_every_node_and_sums_them_per_operator(tmp_path):
    out = tmp_path / "ort.md"
    run_script("profile_onnxruntime.py", "zoo:mcu_cnn", "--runs", "3", "--warmup", "1", "--out", str(out))
    text = out.read_text()
    total = float(text.split("Sum over the nodes: ")[1].split(" us")[0].replace(",", ""))
    nodes = [line.split("|") for line in text.split("In the order they ran:")[1].splitlines() if line.startswith("| ")]
    node_us = [float(row[3].replace(",", "")) for row in nodes[2:]]
    assert any(row[2].strip() == "Conv" for row in nodes[2:])
    assert abs(sum(node_us) - total) <= len(node_us)  # each row rounded to a microsecond


def test_time_blocked_conv_times_the_forced_tiles_and_orders_beside_the_default(tmp_path):
    out = tmp_path / "variants.md"
    run_script(
        "time_blocked_conv.py",
        *("32x8x8:32:3", "--tiles", "1x8", "--orders", "rows", "--repeat", "1", "--rotate-mib", "1"),
        *("--target", '{"kind":"llvm","mcpu":"haswell"}', "--out", str(out)),
    )
    rows = {line.split("|")[2].strip(): line.split("|") for line in out.read_text().splitlines() if "| 32x8x8" in line}
    assert set(rows) == {"default", "tile 1x8", "order rows"}
    assert rows["tile 1x8"][3].strip() == "1 x 8"
    assert rows["order rows"][4].strip().startswith("`b_oh")
    assert float(rows["default"][7]) == 1.0 and float(rows["tile 1x8"][6].replace(",", "")) > 0


def test_time_blocked_conv_says_what_a_convolution_spec_looks_like(tmp_path):
    done = run_script("time_blocked_conv.py", "64x56:64:3", returncode=1)
    assert "is not CINxHxW:COUT:K[sSTRIDE]" in done.stderr and "Traceback" not in done.stderr
