# Transitional re-export.
from objreg.toolkit.cache import *  # noqa: F401,F403
