"""bench/peer/report.py's merge: a re-run of whole files replaces those files' results in a committed report and
leaves the others' as they were."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "peer_report", Path(__file__).resolve().parent.parent / "bench" / "peer" / "report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)
merge, summarize = report.merge, report.summarize


def case(test_id: str, outcome: str, reason: str = "") -> dict:
    return {"id": test_id, "file": test_id.split("::")[0], "outcome": outcome, "reason": reason, "seconds": 0.0}


def test_rerun_files_replace_theirs_only():
    base = summarize([case("test_a.py::t1", "passed"), case("test_a.py::t2", "failed", "x"),
                      case("test_b.py::t1", "failed", "old"), case("test_ctx_shift.py::test_ctx_shift_enabled", "failed")])
    base["n_reported"] = 4
    new = summarize([case("test_b.py::t1", "passed"), case("test_c.py::t1", "failed", "new"),
                     case("test_ctx_shift.py::test_ctx_shift_enabled", "passed")])
    out = merge(base, new)
    assert out["files"]["test_a.py"]["failed"] == 1 and out["files"]["test_b.py"] == new["files"]["test_b.py"]
    assert [c["id"] for c in out["failures"]] == ["test_a.py::t2", "test_c.py::t1"]
    assert [c["outcome"] for c in out["model_specific"]] == ["passed"]  # the re-run's, not the base's
    assert out["total"]["passed"] == 2 and out["total"]["failed"] == 2 and out["pass_rate_in_scope"] == 0.5
    assert out["n_reported"] == 4 - 2 + 3
