# Transitional re-export while the restructure lands; deleted before the change is committed as done.
from objreg.toolkit.lengths import *  # noqa: F401,F403
from objreg.toolkit.losses import *  # noqa: F401,F403
from objreg.toolkit.masked_lm import *  # noqa: F401,F403
from objreg.toolkit.modifiers import *  # noqa: F401,F403
from objreg.toolkit.noise import *  # noqa: F401,F403
from objreg.toolkit.replacement import *  # noqa: F401,F403
from objreg.toolkit.selection import *  # noqa: F401,F403
