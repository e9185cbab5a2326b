"""The ``cdclake`` command line."""
