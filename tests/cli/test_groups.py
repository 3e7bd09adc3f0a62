"""``plan --groups`` and ``compare-groups --groups``: the report, the JSON rows, and one-line errors."""

import json

import pytest

from .test_plan import run_cli


@pytest.mark.parametrize(
    "argv",
    [
        ("compare-groups", "--groups", "0"),
        ("compare-groups", "--groups", "x"),
        ("compare-groups", "--groups", "1,,2"),
        ("plan", "--groups", "0"),
        ("plan", "--groups", "-3"),
    ],
)
def test_bad_group_settings_are_one_line_and_exit_2(capsys, small_onnx, argv):
    command, *rest = argv
    code, out, err = run_cli(capsys, command, small_onnx, *rest)
    assert code == 2 and not out
    assert err.count("\n") == 1 and "groups must be" in err


def test_plan_groups_reports_layers_and_the_unconstrained_arena(capsys, small_onnx):
    code, out, _ = run_cli(capsys, "plan", small_onnx, "--groups", "1", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["groups"] == 1
    # layers count the concat the planner writes in place; groups and kernels only what launches
    assert 0 < report["group_count"] <= min(report["layers"], report["kernels"])
    assert report["lower_bound_bytes"] <= report["arena_bytes"]
    assert report["arena_bytes"] >= report["unconstrained_arena_bytes"] > 0
    code, out, _ = run_cli(capsys, "plan", small_onnx, "--groups", "seq")
    assert code == 0 and "arena without the F-predicate" in out


@pytest.mark.slow
def test_compare_groups_json_rows(capsys, small_onnx):
    code, out, _ = run_cli(
        capsys,
        "compare-groups",
        small_onnx,
        "--groups",
        "seq,1",
        "--repeat",
        "2",
        "--rounds",
        "2",
        "--min-repeat-ms",
        "1",
        "--json",
    )
    assert code == 0
    result = json.loads(out)
    assert [row["groups"] for row in result["rows"]] == ["seq", 1]
    assert [row["pipeline"] for row in result["baselines"]] == ["memplan", "stock"]
    for row in result["rows"] + result["baselines"]:
        for key in ("latency_ms", "latency_spread_ms", "arena_bytes", "launches"):
            assert row[key] >= 0
        assert row["identical"] and row["correct"] and row["requested_equals_plan"]
    seq, one = result["rows"]
    assert seq["group_launches"] == seq["launches"]
    assert one["group_launches"] <= min(one["layers"], seq["group_launches"])
    assert result["naive_bytes"] >= max(row["arena_bytes"] for row in result["rows"])
    assert result["choice"] in (None, "seq", 1)


def test_the_measured_choice_needs_a_margin_beyond_both_spreads():
    from tvm_memplan.deploy.groups import GroupBench, GroupRow

    def row(groups, pipeline, ms, spread):
        return GroupRow(groups, pipeline, ms, spread, 0, 1, None, None, None, True, True, None, None)

    bench = GroupBench("m", "host", "local", "2", 0, 0, [row(None, "memplan", 10.0, 0.5), row(1, "memplan", 9.2, 0.4)])
    assert bench.choice() is None  # 9.2 + 0.9 is not below 10
    bench.rows.append(row(2, "memplan", 8.0, 0.2))
    assert bench.choice() == 2
