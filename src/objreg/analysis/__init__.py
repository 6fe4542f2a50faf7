"""The gradient-alignment analysis, in four rooms, each importing only the rooms below it:

* :mod:`objreg.analysis.run` — ``objreg analyze``, ``screen`` and ``finetune``: settings,
  validation, loading, the training loop, weight schedules, the run directory, checkpoints and
  resuming;
* :mod:`objreg.analysis.probe` — the probes a researcher puts in their own loop
  (``TransferProbe``, ``InRunAlignment``), their report, writer, plots, TensorBoard scalars and the
  Hugging Face ``Trainer`` callback;
* :mod:`objreg.analysis.math` — the mathematics: losses as functions of the parameters,
  per-sample dots, Hessian-vector products, ``D`` and ``D*``, the step's split, Shapley values,
  Taylor terms, the weights' quadratic model, the spectrum, intervals;
* :mod:`objreg.analysis.parallel` — processes and devices: the collectives every process calls
  together, finding the processes a launcher started;

and :mod:`objreg.analysis.records`, the probe record's schema every room speaks.

The map of every module: each room's docstring, and docs/analysis.md ("Where the code is");
tests/analysis/test_module_map.py checks both against the files. run → probe → math → parallel,
never back (``tests/test_import_floors.py``); no module imports a private name of another room
(``tests/analysis/test_private_names.py``). Everything here imports ``objreg.core`` and
``objreg.toolkit``; objectives, tasks, models and corpora are reached through the registry.
"""
