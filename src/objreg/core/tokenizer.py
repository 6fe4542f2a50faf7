# Transitional re-export.
from objreg.toolkit.tokenizer import *  # noqa: F401,F403
from objreg.toolkit.tokenizer import _Chunk  # noqa: F401
from objreg.toolkit.wordpiece import *  # noqa: F401,F403
