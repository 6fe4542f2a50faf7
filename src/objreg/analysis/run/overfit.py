"""A warning when the downstream head has overfitted its fit set.

The head is fitted (a linear probe, :mod:`objreg.analysis.run.headfit`) on examples apart from
the evaluation set that defines ``D``. When its loss on the fit examples ends far below ``D`` at
the first step, the head has learnt those examples rather than the task: ``D`` and its gradient
then measure a memorising head, and alignment with ``∇D`` says little about the task. The run
goes on; the warning names the two losses and the settings that help.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: ``D`` at least this many times the fit set's loss ...
RATIO = 2.0
#: ... and at least this much above it (loss units), so that two small losses do not warn.
GAP = 0.5


def overfit_warning(head_warmup: Mapping[str, Any], downstream_loss: float, names: Mapping[str, str],
                    refit: bool = False) -> str | None:
    """The warning, or None. ``head_warmup``: the fit's ``examples`` and its final loss
    (``loss_after``: the frozen head's warm-up, or a re-fitted head's fit loss at the first probe);
    ``names``: how the caller names the head-fit settings (``--head-fit-size`` on the command
    line, ``head_fit_size=`` in Python); ``refit``: the head is re-fitted (its only remedy is
    more examples, which also weaken the ``λ = 1/n`` prior less than they add data)."""
    fitted, examples = head_warmup.get("loss_after"), head_warmup.get("examples")
    if fitted is None or not examples:
        return None
    if downstream_loss < RATIO * fitted or downstream_loss - fitted < GAP:
        return None
    return (f"the downstream head fits its {examples:,} fit examples far better (loss {fitted:.4g}) than the "
            f"evaluation set that defines D (D = {downstream_loss:.4g} at step 0): it has learnt those examples "
            f"rather than the task, so D's gradient reflects a memorising head; give it more examples "
            f"({names['head_fit_size']})" + ("" if refit else f" or fewer steps ({names['head_warmup_steps']})"))


def memorising_head(report_config: Mapping[str, Any], first: Mapping[str, Any], names: Mapping[str, str]
                    ) -> str | None:
    """:func:`overfit_warning` of a run, read off its report's ``config`` and its first probe record
    (the run's warning, and the report's "what it cannot tell", say the same)."""
    refit = first.get("downstream_fit")
    fit = ({"loss_after": refit["before"]["fit_loss"], "examples": report_config["downstream_fit"]["examples"]}
           if refit else report_config.get("head_warmup") or {})
    return overfit_warning(fit, first["downstream_loss"], names, refit=refit is not None)
