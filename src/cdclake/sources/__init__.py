"""Sources: the only package that knows Kafka columns and capture files.

Every source yields raw message frames with the columns ``key`` (binary), ``value`` (binary), ``topic``,
``partition``, ``offset`` and ``timestamp`` (see :data:`cdclake.formats.base.MESSAGE_COLUMNS`), then ``headers``
(:data:`cdclake.formats.base.MESSAGE_HEADERS`) from Kafka and from capture files of records (other capture files
have no headers, and no such column).
"""
