"""The bench's results files: results.json as runs finish, results.md, and outputs compared with plain."""

from __future__ import annotations

import json

from saspec_bench import results


def test_identity_is_against_the_plain_run_with_the_same_key_fields():
    runs = [{"size": "a", "id": 1, "method": "plain", "tokens": [1, 2, 3]},
            {"size": "b", "id": 1, "method": "plain", "tokens": [7, 8]},
            {"size": "a", "id": 1, "method": "saspec", "tokens": [1, 2, 3]},
            {"size": "b", "id": 1, "method": "saspec", "tokens": [7, 9]},
            {"size": "a", "id": 1, "method": "short", "tokens": [1, 2]},
            {"size": "a", "id": 2, "method": "saspec", "tokens": [5]}]
    results.mark_identity(runs, key=("size", "id"))
    assert [(r["same_as_plain"], r["first_diff"]) for r in runs] == [
        (True, None), (True, None), (True, None), (False, 1), (False, 2), (None, None)]


def test_publish_writes_both_files_and_prints_the_report(tmp_path, capsys):
    results.save(tmp_path, {"date": "d"}, runs=[1])
    assert json.loads((tmp_path / "results.json").read_text()) == {"info": {"date": "d"}, "runs": [1]}
    assert results.publish(tmp_path, {"date": "e"}, "# report", runs=[1, 2]) == 0
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == [1, 2]
    assert (tmp_path / "results.md").read_text() == "# report" and "# report" in capsys.readouterr().out
