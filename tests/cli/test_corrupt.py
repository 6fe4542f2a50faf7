"""`objreg corrupt`: real text through an objective, shown token by token or as JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import objreg
from objreg.cli import make_cli

TEXT = "The committee met on Tuesday. It approved the budget for the new library. Members argued about the roof."
SHORT = "Bees collect nectar from flowers."


@pytest.fixture
def run():
    group = make_cli(lambda: objreg.get_plugin_manager(load_entrypoints=False))
    return lambda *args: CliRunner().invoke(group, list(args))


def corrupt_json(run, *args) -> dict:
    result = run("corrupt", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_rows(run):
    data = corrupt_json(run, "mlm", "--text", TEXT, "--text", SHORT, "--param", "mask_prob=0.3")
    assert data["objective"] == "mlm"
    assert data["seed"] == 0
    assert data["params"]["mask_prob"] == 0.3
    assert len(data["rows"]) == 2
    for row in data["rows"]:
        assert set(row) == {"original", "original_ids", "input", "input_ids", "labels", "attention_mask", "extras"}
        T = len(row["input"])
        assert len(row["labels"]) == T
        assert len(row["attention_mask"]) == T and all(len(r) == T for r in row["attention_mask"])
        assert row["original"][0] == "[CLS]"
        predicted = [i for i, label in enumerate(row["labels"]) if label is not None]
        assert predicted, "mlm predicts at least one token per row"
        # A label is the original token at that position.
        assert all(row["labels"][i] == row["original"][i] for i in predicted)
        assert all(isinstance(v, list) for v in row["extras"].values())


def test_same_seed_same_bytes_other_seed_differs(run):
    args = ["corrupt", "mlm", "--text", TEXT, "--param", "mask_prob=0.5", "--json"]
    first, again = run(*args), run(*args)
    other = run(*args, "--seed", "1")
    assert first.exit_code == again.exit_code == other.exit_code == 0
    assert first.stdout_bytes == again.stdout_bytes
    assert json.loads(other.stdout)["seed"] == 1
    assert json.loads(other.stdout)["rows"] != json.loads(first.stdout)["rows"]


def test_causal_mask_grid(run):
    result = run("corrupt", "clm", "--text", SHORT)
    assert result.exit_code == 0, result.output
    grid = result.stdout.split("Attention mask of row 0")[1].splitlines()[2:]
    first, second = grid[0].split(), grid[1].split()
    # "0 [CLS] ■ · · ..." : the first query sees only itself, the second sees two keys.
    assert first[:4] == ["0", "[CLS]", "■", "·"] and first[2:].count("■") == 1
    assert second[2:].count("■") == 2
    assert "first 48 of" not in result.stdout


def test_long_text_grid_is_truncated(run):
    result = run("corrupt", "clm", "--text", " ".join([TEXT] * 3))
    assert result.exit_code == 0, result.output
    assert "first 48 of" in result.stdout
    assert "[CLS]" in result.stdout  # token strings are printed literally, not read as markup


def test_seq_len_truncates(run):
    data = corrupt_json(run, "clm", "--text", TEXT, "--seq-len", "8")
    assert len(data["rows"][0]["input"]) == 8


def test_downstream_task_is_refused(run):
    result = run("corrupt", "qa", "--text", TEXT)
    assert result.exit_code == 1
    assert "'qa' is a downstream task" in result.stderr


@pytest.mark.parametrize("param", ["mask_prob", "nope=1"])
def test_bad_param_names_the_allowed_ones(run, param):
    result = run("corrupt", "mlm", "--text", TEXT, "--param", param)
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert all(name in result.stderr for name in ("mask_prob", "mask_replace_prob", "random_replace_prob"))


def test_out_of_range_param(run):
    result = run("corrupt", "mlm", "--text", TEXT, "--param", "mask_prob=2")
    assert result.exit_code == 1
    assert "mask_prob" in result.stderr and "[0.0, 1.0]" in result.stderr


def test_char_noise_changes_the_text_deterministically(run):
    def rows(*extra):
        result = run("corrupt", "mlm", "--text", TEXT, "--seed", "4", "--json", *extra)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)["rows"]

    clean, noisy, again = rows(), rows("--char-noise", "0.2"), rows("--char-noise", "0.2")
    assert noisy == again
    assert noisy[0]["original"] != clean[0]["original"]


def test_inverse_frequency_policy_previews_with_counts_from_the_texts(run):
    result = run("corrupt", "mlm", "--text", TEXT, "--param", "masking_policy=inverse_frequency", "--json")
    assert result.exit_code == 0, result.stderr
    labels = json.loads(result.stdout)["rows"][0]["labels"]
    assert any(label is not None for label in labels)
