# Transitional re-export.
from objreg.toolkit.surprisal import *  # noqa: F401,F403
