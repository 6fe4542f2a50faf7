"""The plugin contract: hook specs, types, the plugin manager and registry, masks, errors.

Imports nothing else of objreg; everything else imports from here.
"""
