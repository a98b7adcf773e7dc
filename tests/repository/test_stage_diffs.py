"""docs/stage-diffs.md is the diff of the stage files as they are now (tools/stage_diffs.py)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_published_stage_diffs_are_up_to_date():
    check = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "stage_diffs.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_the_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import stage_diffs
    finally:
        sys.path.pop(0)
    stale = tmp_path / "stage-diffs.md"
    stale.write_text(stage_diffs.page().replace("param_shard", "param_full", 1))
    monkeypatch.setattr(stage_diffs, "PAGE", str(stale))
    assert stage_diffs.main(["--check"]) == 1
    stage_diffs.main([])
    assert stage_diffs.main(["--check"]) == 0
