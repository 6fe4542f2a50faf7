"""``objreg analyze``: the run from names to a report (:mod:`.analyze`), its settings
(:mod:`.config`, :mod:`.validation`), loading and the head fit (:mod:`.prepare`, :mod:`.headfit`),
the training loop (:mod:`.loop`), weight schedules (:mod:`.schedules`, :mod:`.adaptive`), and the
run directory: ownership (:mod:`.rundir`), fingerprint (:mod:`.fingerprint`), sealed checkpoints
and resuming (:mod:`.checksum`, :mod:`.resume`), resource failures (:mod:`.failures`), the trained
backbone a run leaves (:mod:`.trained`) and evaluation text kept out of pre-training (:mod:`.unseen`).
``objreg finetune``: fine-tuning and the linear probe beside it (:mod:`.finetune`)."""
