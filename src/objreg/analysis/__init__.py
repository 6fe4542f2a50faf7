"""The gradient-alignment analysis, in four rooms, each importing only the rooms below it:

* :mod:`objreg.analysis.run` — ``objreg analyze``: settings, validation, loading, the training
  loop, weight schedules, the run directory, checkpoints and resuming;
* :mod:`objreg.analysis.probe` — the probe a researcher puts in their own loop
  (``TransferProbe``), its records, report, writer, plots, TensorBoard scalars and the Hugging
  Face ``Trainer`` callback;
* :mod:`objreg.analysis.math` — the mathematics: losses as functions of the parameters,
  per-sample dots, Hessian-vector products, ``D``, the step's split, Shapley values, Taylor
  terms, the mixture model, the spectrum, intervals;
* :mod:`objreg.analysis.parallel` — processes and devices: the collectives every process calls
  together, finding the processes a launcher started.

run → probe → math → parallel, never back (``tests/test_import_floors.py``). Everything here
imports ``objreg.core`` and ``objreg.toolkit``; objectives, tasks, models and corpora are reached
through the registry.
"""
