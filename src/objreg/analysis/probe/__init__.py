"""The probes a researcher puts in their own training loop, made by :func:`~.make.make_probe`
(:mod:`.make`; its mode chooses the probe, its numeric settings are :mod:`.settings`'
``ProbeSettings``). :class:`~.transfer_probe.TransferProbe` (:mod:`.transfer_probe`): its arguments checked (:mod:`.arguments`), its measurements
(:mod:`.engine`), attached to the optimizer (:mod:`.attached`, through :mod:`.optimizer_hooks`),
checkpointed (:mod:`.checkpoint`, the state's checks :mod:`.state`), the objectives' own
gradients (:mod:`.objective_gradients`) with the loop's forward replayed (:mod:`.replay`) and its
rescaled weights (:mod:`.clipping`), its checks at each step (:mod:`.step_checks`) and of the step
it split (:mod:`.split_check`), attention it can differentiate (:mod:`.attention`), example scores
(:mod:`.attribution`). ``InRunAlignment``, first order at the step's own cost (:mod:`.in_run`);
the probe of a sharded model (:mod:`.sharded`); the first-order probe ``objreg screen`` ranks by
(:mod:`.first_order`). The outputs: the report (:mod:`.report`), a run
directory's files (:mod:`.writer`, :mod:`.plots`), TensorBoard scalars (:mod:`.tensorboard`) and
the Hugging Face ``Trainer`` callback (:mod:`.hf_callback`). The records' types are
:mod:`objreg.analysis.records`. Imports :mod:`objreg.analysis.math` and below, never
:mod:`objreg.analysis.run`."""
