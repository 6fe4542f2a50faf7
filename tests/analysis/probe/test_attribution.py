"""Per-example scores: accumulation over steps and the helpful/harmful ranking."""

from __future__ import annotations

from objreg.analysis.probe.attribution import ExampleScores


def test_scores_accumulate_per_example_and_rank():
    scores = ExampleScores()
    scores.add("mlm", 0, [[5, 6], [7], [8, 9]], [0.5, -0.25, 0.0])
    scores.add("mlm", 3, [[5, 6]], [0.25])  # the same example drawn again
    scores.add("sop", 3, [[5, 6], [1, 2]], [-1.0, 2.0])  # the same ids under another objective are another example
    assert len(scores) == 5
    top = scores.top(2, decode=lambda ids: "-".join(map(str, ids)))
    assert top["examples"] == 5
    assert top["helpful"] == [
        {"objective": "sop", "score": 2.0, "steps": [3], "text": "1-2"},
        {"objective": "mlm", "score": 0.75, "steps": [0, 3], "text": "5-6"},
    ]
    assert [(e["objective"], e["score"]) for e in top["harmful"]] == [("sop", -1.0), ("mlm", -0.25)]
    # Zero scores are neither; without a decoder the ids are shown.
    assert scores.top(10)["helpful"][-1]["text"] == "5 6" and len(scores.top(10)["harmful"]) == 2
