"""Built-in corpora plugins."""
