"""Compatibility layers: other projects' scheduler APIs on top of schedir's step IR."""
