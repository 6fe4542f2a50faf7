"""Built-in tasks plugins."""
