"""The probe a researcher puts in their own training loop: :class:`~.transfer_probe.TransferProbe`
(its arguments checked in :mod:`.arguments`, its measurements in :mod:`.engine`), the records'
types (:mod:`.records`), example scores (:mod:`.attribution`), the report (:mod:`.report`), a
run directory's files (:mod:`.writer`, :mod:`.plots`), TensorBoard scalars (:mod:`.tensorboard`)
and the Hugging Face ``Trainer`` callback (:mod:`.hf_callback`). Imports
:mod:`objreg.analysis.math` and below, never :mod:`objreg.analysis.run`."""
