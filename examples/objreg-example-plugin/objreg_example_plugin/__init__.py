"""An example third-party objreg plugin; the objective lives in :mod:`objreg_example_plugin.rlm`."""
