"""The `schedir` command line."""
