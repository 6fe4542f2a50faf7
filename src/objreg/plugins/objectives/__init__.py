"""Built-in objectives plugins."""
