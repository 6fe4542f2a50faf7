"""``objreg analyze``: the run from names to a report (:mod:`.analyze`), its settings
(:mod:`.config`, :mod:`.validation`), loading and the head fit (:mod:`.prepare`, :mod:`.headfit`),
the training loop (:mod:`.loop`), weight schedules (:mod:`.schedules`, :mod:`.adaptive`), and the
run directory: ownership (:mod:`.rundir`), fingerprint (:mod:`.fingerprint`), sealed checkpoints
and resuming (:mod:`.checksum`, :mod:`.resume`), resource failures (:mod:`.failures`)."""
