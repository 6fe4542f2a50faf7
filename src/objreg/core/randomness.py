# Transitional re-export.
from objreg.toolkit.randomness import *  # noqa: F401,F403
