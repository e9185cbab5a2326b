"""Huawei DRS JSON to Kafka: ``drs-json-mysql``, ``drs-jsonc-mysql``, ``drs-json-relational``.

Spec: ``shared/formats/drs.md`` sections 2-4. The layout is the Canal flat message (decoded by
:func:`cdclake.formats.canal.make_decoder`); the DRS differences are the :class:`~cdclake.formats.canal.Dialect`
settings below:

* ``type`` adds ``INIT`` (full-load row -> UPSERT) and ``INIT_DDL`` (full-load DDL -> DDL) (section 2).
* ``old`` is the full before row; DRS JSON puts a DELETE's row in ``old``, JSON-C in ``data`` (sections 2, 3). A
  DELETE with its row in the other array proves the topic has the other variant: it is a dead letter naming the
  right format (JSON and JSON-C also render TIMESTAMP differently, so a wrong choice must not pass silently).
* ``id`` is DRS's monotonically increasing event sequence number -> ordering position (section 2).
* Binaries are byte-list text ``"[106, 103]"`` (MySQL, section 2) or bare hex (bytea, section 4).
* MySQL TIMESTAMP is ``"<epochSeconds>.<fraction>"`` in JSON and ``yyyy-MM-dd HH:mm:ss`` in JSON-C (zone not
  documented: option ``source_timezone``, default UTC).

Choices where the spec is silent: a ``DDL`` message whose ``sql`` is ``TRUNCATE [TABLE] name`` of the message's
own table is a TRUNCATE (DRS has no TRUNCATE type; :func:`cdclake.formats.canal.truncates_table`); bare ``decimal``
(no precision in ``mysqlType``) and relational ``numeric`` -> string (exact text); MySQL ``bit`` -> string (its DRS
rendering is not documented); Oracle / SQL Server tables (empty ``columnType``) -> every column string, named by the
keys of ``sqlType``.
"""

from __future__ import annotations

from typing import Final

from cdclake.formats.canal import Dialect, format_for
from cdclake.model import Op

# drs.md section 2: "INSERT->INSERT, UPDATE->UPDATE, DELETE->DELETE, DDL->DDL, INIT->UPSERT, INIT_DDL->DDL".
OPERATIONS: Final = {
    "INSERT": Op.INSERT,
    "UPDATE": Op.UPDATE,
    "DELETE": Op.DELETE,
    "DDL": Op.DDL,
    "INIT": Op.UPSERT,
    "INIT_DDL": Op.DDL,
}

DRS_JSON_MYSQL: Final = Dialect(
    name="drs-json-mysql",
    operations=OPERATIONS,
    delete_row_in="old",
    bit_type="string",
    binary_encoding="bytelist",
    timestamp_encoding="epoch_seconds",
    position_from_id=True,
    wrong_delete_hint="DELETE with its row in `data` and `old` null: that is DRS JSON-C (drs.md section 3), "
    "configure the format drs-jsonc-mysql for this topic",
)

DRS_JSONC_MYSQL: Final = Dialect(
    name="drs-jsonc-mysql",
    operations=OPERATIONS,
    delete_row_in="data",
    bit_type="string",
    binary_encoding="bytelist",
    timestamp_encoding="text",
    position_from_id=True,
    wrong_delete_hint="DELETE with its row in `old` and `data` null: that is DRS JSON (drs.md section 3), "
    "configure the format drs-json-mysql for this topic",
)

DRS_JSON_RELATIONAL: Final = Dialect(
    name="drs-json-relational",
    operations=OPERATIONS,
    delete_row_in="old",
    types="relational",
    binary_encoding="hex",
    timestamp_encoding="text",
    position_from_id=True,
    wrong_delete_hint="DELETE with its row in `data` and `old` null: DRS JSON for Oracle/PostgreSQL/GaussDB/SQL "
    "Server puts deleted rows in `old` (drs.md section 4)",
)

FORMAT_JSON: Final = format_for(
    DRS_JSON_MYSQL,
    "Huawei DRS JSON for MySQL / TaurusDB (Canal-like; DELETE row in old, byte lists, epoch-second TIMESTAMPs)",
    ("drs-json-mysql.jsonl",),
)
FORMAT_JSONC: Final = format_for(
    DRS_JSONC_MYSQL,
    "Huawei DRS JSON-C for MySQL / TaurusDB (as DRS JSON, but DELETE row in data, text TIMESTAMPs)",
    ("drs-jsonc-mysql.jsonl",),
)
FORMAT_RELATIONAL: Final = format_for(
    DRS_JSON_RELATIONAL,
    "Huawei DRS JSON for Oracle / PostgreSQL / GaussDB / SQL Server (columnType, hex bytea, text timestamps)",
    ("drs-json-relational.jsonl",),
)
