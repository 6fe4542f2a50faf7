"""``objreg analyze``: the run from names to a report (:mod:`.analyze`); its settings and their
checks (:mod:`.config`, :mod:`.validation`, :mod:`.naming`, :mod:`.contract`); loading and the
start (:mod:`.prepare`), the head fitted before training (:mod:`.headfit`) and the warning when
it overfits (:mod:`.overfit`), evaluation text kept out of pre-training (:mod:`.unseen`); the
training loop (:mod:`.loop`); weight schedules (:mod:`.schedules`, :mod:`.adaptive`); the run
directory: ownership (:mod:`.rundir`), what the numbers depend on (:mod:`.fingerprint`, its
hashes :mod:`.digests`, the inputs hashed as they load :mod:`.run_inputs`), sealed checkpoints
and resuming (:mod:`.checksum`, :mod:`.resume`), resource failures (:mod:`.failures`) and the
trained backbone a run leaves (:mod:`.trained`). ``objreg screen``'s short runs
(:mod:`.screen`): the candidates and budget (:mod:`.screen_candidates`), one candidate's run
(:mod:`.screen_run`), their signals (:mod:`.screen_signals`) and the setting its validity is read
for (:mod:`.screen_setting`); ``objreg finetune``'s fine-tunes and linear probe (:mod:`.finetune`)."""
