"""The contract suites, for built-ins and third-party plugins alike: objectives and tasks.

    from objreg.testing import check_objective_contract, check_task_contract

    def test_my_objective_keeps_the_contract():
        check_objective_contract("myobjective")

    def test_my_task_keeps_the_contract():
        check_task_contract("mytask")

:func:`check_objective_contract` runs the objective on a tiny model in float64 and checks what
``objreg analyze`` relies on (:mod:`objreg.testing.objective_contract` lists the checks);
:func:`check_task_contract` checks what docs/writing-a-plugin.md asks a downstream task's author
to write (:mod:`objreg.testing.task_contract`); what the two share is in
:mod:`objreg.testing.checks`. Every failed check is reported, in one :class:`ContractError`
naming the objective or task, also when a hook raises (a loss that calls ``.item()`` fails the
``vmap`` check, with what to change). ``quick=True`` skips the Hessian-vector products:
``objreg analyze`` runs the objective's cheap checks (:func:`contract_problems`) on every
objective that is not built in (:func:`is_third_party`) before training, and warns in one line
when one fails.
"""

from objreg.testing.checks import SAMPLE_TEXTS, TINY_MODEL, ContractError, raised, sample_tokenizer
from objreg.testing.objective_contract import check_objective_contract, contract_problems, is_third_party
from objreg.testing.task_contract import check_task_contract

__all__ = [
    "SAMPLE_TEXTS", "TINY_MODEL", "ContractError", "check_objective_contract", "check_task_contract",
    "contract_problems", "is_third_party", "raised", "sample_tokenizer",
]
