"""The end of ``objreg screen``'s output, read off hand-made reports: what the ranking tells, what
it cannot, and runnable commands for what to run next."""

from __future__ import annotations

import shlex

from objreg.cli.screen_assessment import assess


def entry(name, rank, mean, low, high, lookahead, objectives=None, params=None, steps=8):
    return {"candidate": name, "objectives": objectives or [name], "params": params or {}, "runnable": True,
            "rank": rank, "score": {"mean": mean, "low": low, "high": high},
            "lookahead": {"mean": lookahead, "low": 0.0, "high": 0.0}, "steps": steps}


def report(candidates, model="default", data=None, validity="validity: not validated for this setting (...)"):
    return {"downstream": "classification", "budget": "8 steps", "validity": validity, "candidates": candidates,
            "config": {"model": model, "corpus": "default", "downstream_data": data, "optimizer": "adamw",
                       "lr": 1e-4, "batch_size": 16, "seq_len": 64, "eval_size": 64, "head_fit_size": 128,
                       "seed": 3}}


def test_a_ranking_names_its_first_and_the_outcome_commands_for_a_hugging_face_model():
    found = dict(assess(report([entry("mlm:mask_prob=0.4", 1, 0.5, 0.4, 0.6, 0.2, ["mlm"], {"mlm": {"mask_prob": "0.4"}}),
                                entry("sop", 2, 0.1, 0.0, 0.2, 0.3)], model="/models/mini lm", data="d/train.tsv")))
    assert found["What the ranking tells"][0].startswith("mlm:mask_prob=0.4 ranks first")
    assert "does not agree" in found["What the ranking tells"][1] and "sop's" in found["What the ranking tells"][1]
    assert any("not validated here" in line for line in found["What it cannot tell"])
    commands = [line for line in found["What to run next"] if line.startswith("objreg ")]
    analyze, finetune = shlex.split(commands[0]), shlex.split(commands[1])
    assert analyze[:4] == ["objreg", "analyze", "--pretrain", "mlm"] and "/models/mini lm" in analyze
    assert analyze[analyze.index("--steps") + 1] == "80" and analyze[-2:] == ["--param", "mlm.mask_prob=0.4"]
    assert analyze[analyze.index("--seed") + 1] == "3"
    out = analyze[analyze.index("--out") + 1]
    assert finetune[:3] == ["objreg", "finetune", out] and finetune[-2:] == ["--downstream-data", "d/train.tsv"]
    assert len(commands) == 5  # the top two, each continued and fine-tuned, and the model as it is
    assert shlex.split(commands[-1])[:3] == ["objreg", "finetune", "/models/mini lm"]


def test_all_tied_says_so_and_asks_for_a_longer_budget_on_the_default_model():
    found = dict(assess(report([entry("mlm", 1, 0.5, -1, 2, 0.2), entry("clm", 1, 0.4, -1, 2, 0.1)])))
    assert found["What the ranking tells"][0].startswith("Nothing about the order")
    assert any("default backbone" in line for line in found["What it cannot tell"])
    longer = shlex.split(next(line for line in found["What to run next"] if "objreg screen" in line).split(": ", 1)[1])
    assert longer[longer.index("--budget") + 1] == "16" and longer[longer.index("--candidates") + 1] == "mlm,clm"
    assert not any("objreg finetune" in line for line in found["What to run next"])  # the default model is not saved
    mixture = dict(assess(report([entry("mlm+sop", 1, 0.5, 0.4, 0.6, 0.2, ["mlm", "sop"]),
                                  entry("clm", 2, 0.1, 0.0, 0.2, 0.1)])))
    analyze = shlex.split(next(line for line in mixture["What to run next"] if "--pretrain mlm,sop" in line))
    assert analyze[analyze.index("--weights") + 1] == "mlm=0.5,sop=0.5"  # as the screen trained it
