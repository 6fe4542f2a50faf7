# Transitional re-export while the restructure lands; deleted before the change is committed as done.
from objreg.toolkit.selection import maskable as ordinary_tokens  # noqa: F401
from objreg.toolkit.seq2seq import *  # noqa: F401,F403
from objreg.toolkit.seq2seq import attention as seq2seq_attention_mask  # noqa: F401,E402
from objreg.toolkit.spans import *  # noqa: F401,F403
