"""Built-in models plugins."""
