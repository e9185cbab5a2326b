"""cdclake: land database change streams from Kafka in lakehouse tables, exactly once.

The layers, each knowing only what it must:

* :mod:`cdclake.model` — the canonical change event every format decodes into (no Spark session, no sink).
* :mod:`cdclake.formats` — one module per wire format, each a set of pure Spark SQL column expressions,
  registered by name (``dataworks-json``, ...).
* :mod:`cdclake.sources` — the only layer that knows Kafka columns and capture files.
* :mod:`cdclake.apply` — folds the changes of each row key in order; sink-agnostic.
* :mod:`cdclake.sinks` — the only layer that knows Delta Lake (and, later, Iceberg).
* :mod:`cdclake.pipeline` — ties them together for ``cdclake run`` (streaming) and ``cdclake replay`` (files),
  through one code path.
"""

from __future__ import annotations

from cdclake.formats import get_format, list_formats
from cdclake.model import Op

__all__ = ["Op", "__version__", "get_format", "list_formats"]
__version__ = "0.1.0"
