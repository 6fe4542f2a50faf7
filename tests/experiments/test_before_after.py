"""The before/after table of docs/experiments.md: both sides read from result files, the start's
through a snapshot taken with git."""

from __future__ import annotations

import json
import subprocess

from objreg.experiments import before_after, docs


def result(verdict: str, n80: int | None, seeds: int = 3, model: str = "default") -> dict:
    effects = [0.1, 0.3, -0.05][:seeds] + [0.1] * max(0, seeds - 3)
    tests = {"effect": {"per_seed": effects, "threshold": 0.0, "direction": "above", "verdict": verdict}}
    return {"verdict": verdict, "reason": "r", "figures": {"effect": sum(effects) / seeds, "tests": tests},
            "setting": {"seeds": list(range(seeds)), "model": model}, "timing": {"cpu_s": 60.0 * seeds},
            "replicates": [{"verdict": verdict}] * seeds,
            "power": {"n80": n80, "sd": 0.1, "part": "effect", "mean": 0.1, "parts": {}}}


def test_rows_show_what_changed_and_what_holds_a_verdict():
    before = {"commit": "abc1234", "rows": {
        "weight-tying": {**before_after.row_of("weight-tying", result("inconclusive", 9)), "hardware": False}}}
    results = {"weight-tying": result("confirmed", 9, seeds=6),
               "span-length-qa": result("inconclusive", 1000, model="all-MiniLM-L6-v2")}
    block = before_after.table(before, results)
    assert block.splitlines()[0] == "| experiment | at `abc1234` | now | seeds run | n80 | setting |"
    assert ("| `weight-tying` | **inconclusive** (power: n80 = 9 seeds (3 run)) | **confirmed** | 3 → 6 | 9 "
            "| toy backbone, CPU |") in block
    # 1,000 seeds at 60 CPU s a seed is past the three CPU hours an experiment may take here.
    assert ("| `span-length-qa` | not run | **inconclusive** (power: n80 = 1000 seeds (3 run); held by this hardware) "
            "| — → 3 | — → 1000 | — → MiniLM continued pre-training, CPU |") in block
    page = f"a\n{before_after.START}\nold\n{before_after.END}\nb\n"
    assert before_after.render(page, results, before) == f"a\n{before_after.START}\n{block}\n{before_after.END}\nb\n"
    assert before_after.render("no markers", results, before) == "no markers"


def test_a_snapshot_reads_the_results_a_commit_held(tmp_path):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    folder = tmp_path / "docs" / "experiments" / "results"
    folder.mkdir(parents=True)
    git("init", "-q")
    (folder / "weight-tying.json").write_text(json.dumps(result("inconclusive", 9)))
    git("add", ".")
    git("commit", "-qm", "first")
    first = git("rev-parse", "--short", "HEAD")
    (folder / "weight-tying.json").write_text(json.dumps(result("confirmed", 9, seeds=6)))
    git("commit", "-qam", "second")
    taken = before_after.snapshot(first, tmp_path)
    assert taken["commit"] == first
    assert taken["rows"] == {"weight-tying": {"verdict": "inconclusive", "reason": "power: n80 = 9 seeds (3 run)",
                                              "hardware": False, "seeds": 3, "n80": 9, "setting": "toy backbone, CPU"}}


def test_the_committed_snapshot_is_what_the_page_was_built_from():
    page = (docs.DOCS / "experiments.md").read_text()
    assert before_after.START in page and before_after.SNAPSHOT.is_file()
    snapshot = json.loads(before_after.SNAPSHOT.read_text())
    assert set(snapshot["rows"]) <= set(docs.load_results(docs.DOCS / "experiments" / "results"))
