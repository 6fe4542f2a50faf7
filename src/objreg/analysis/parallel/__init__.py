"""Processes and devices: the collectives every process calls together (:mod:`.group`), finding
the processes a launcher started (:mod:`.launch`), and resolving a device name (:mod:`.devices`).
Imports no other room of :mod:`objreg.analysis`."""
