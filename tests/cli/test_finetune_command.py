"""``objreg finetune``: the table and JSON, --out's files (checked before any work, never
overwritten, never written through a link), and one clear error for bad input."""

from __future__ import annotations

import json
import re

import pytest

SMALL = ["--downstream", "classification", "--folds", "2", "--epochs", "1", "--batch-size", "8", "--seq-len", "32"]


def assert_one_error(output: str, pattern: str) -> None:
    """One ``Error:`` line matching ``pattern`` (the progress lines on stderr aside), no traceback."""
    errors = [line for line in output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and re.search(pattern, errors[0]), output
    assert "Traceback" not in output


@pytest.fixture
def run(command):
    return command("finetune")


def test_table_json_and_out_files(run, tiny_bert, sentiment_tsv, tmp_path):
    out = tmp_path / "ft"
    result = run(str(tiny_bert), *SMALL, "--downstream-data", str(sentiment_tsv), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "fine-tuned" in result.stdout and "linear probe" in result.stdout and "D*" in result.stdout
    saved = json.loads((out / "finetune.json").read_text())
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(r["row"] for r in rows) == list(range(60))
    assert saved["summary"]["finetune"]["accuracy"]["mean"] == pytest.approx(sum(r["accuracy"] for r in rows) / 60)
    as_json = run(str(tiny_bert), *SMALL, "--downstream-data", str(sentiment_tsv), "--json")
    assert as_json.exit_code == 0
    printed = json.loads(as_json.stdout)
    printed.pop("timing"), saved.pop("timing")
    assert printed == saved  # the same seed, the same numbers

    again = run(str(tiny_bert), *SMALL, "--downstream-data", str(sentiment_tsv), "--out", str(out))
    assert again.exit_code == 1 and "already holds finetune.json" in again.output
    assert json.loads((out / "finetune.json").read_text())["summary"] == saved["summary"]  # nothing lost


@pytest.mark.parametrize("args, message", [
    (["--folds", "100"], r"folds \(--folds\) must lie in \[2, \d+\] \(the groups of rows"),
    (["--epochs", "0"], "epochs must be an integer >= 1"),
    (["--lr", "-1"], "lr must be a finite number > 0"),
    (["--downstream", "ordering"], "reports no metric"),
    (["--downstream-data", "/nonexistent.tsv"], "nonexistent"),
])
def test_bad_input_is_one_line_and_exit_1(run, tiny_bert, sentiment_tsv, args, message):
    given = ["--downstream-data", str(sentiment_tsv), *args] if "--downstream-data" not in args else args
    result = run(str(tiny_bert), *given)
    assert result.exit_code == 1, result.output
    assert_one_error(result.output, message)


def test_out_through_a_link_is_refused_before_any_work(run, tiny_bert, sentiment_tsv, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    (out / "finetune.json").symlink_to(target)
    result = run(str(tiny_bert), *SMALL, "--downstream-data", str(sentiment_tsv), "--out", str(out))
    assert result.exit_code == 1 and "symbolic link" in result.output
    assert target.read_text() == "keep"


def test_a_model_directory_without_a_tokenizer(run, tmp_path, sentiment_tsv, tiny_bert):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((tiny_bert / "config.json").read_text())
    result = run(str(bare), *SMALL, "--downstream-data", str(sentiment_tsv))
    assert result.exit_code == 1
    assert_one_error(result.output, "tokenizer")
