"""Sinks: the only package that knows a table format. Delta Lake is the default (:mod:`cdclake.sinks.delta`)."""
