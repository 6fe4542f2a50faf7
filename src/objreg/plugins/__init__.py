"""Built-in plugins, each module written exactly like a third-party plugin.

They are registered by name from ``objreg.core.manager.BUILTIN_PLUGINS``, the same call that
registers entry-point plugins. Nothing in objreg imports these modules directly.
"""
