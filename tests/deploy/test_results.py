from __future__ import annotations

import json
import threading

from tvm_memplan.deploy.results import ResultsLog


def test_append_keeps_every_record_and_no_temporary_files(tmp_path):
    log = ResultsLog(tmp_path / "sub" / "log.jsonl")
    threads = [threading.Thread(target=log.append, args=({"i": i},)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r["i"] for r in log.records()) == list(range(20))
    assert sorted(p.name for p in log.path.parent.iterdir()) == ["log.jsonl", "log.jsonl.lock"]


def test_a_line_cut_by_an_older_writer_does_not_swallow_the_next_record(tmp_path):
    log = ResultsLog(tmp_path / "log.jsonl")
    log.path.write_text(json.dumps({"a": 1}))  # no trailing newline
    log.append({"b": 2})
    assert list(log.records()) == [{"a": 1}, {"b": 2}]


def test_write_or_print_writes_the_table_where_told_and_prints_it_otherwise(tmp_path, capsys):
    from tvm_memplan.deploy.results import write_or_print

    write_or_print(tmp_path / "t" / "table.md", "| a |\n")
    assert (tmp_path / "t" / "table.md").read_text() == "| a |\n" and capsys.readouterr().out == ""
    write_or_print(None, "| b |\n")
    assert capsys.readouterr().out == "| b |\n"
