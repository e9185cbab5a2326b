"""Pipeline configuration (``cdclake run CONFIG.yaml``), validated with pydantic.

Every error names the key and the fix. Kafka options are passed through to Spark's Kafka source; values of keys
that look secret (passwords, JAAS configs, keys, tokens) are never printed.

Example::

    name: orders-cdc
    lake: /data/lake
    checkpoint: /data/checkpoints/orders-cdc      # default: <lake>/_cdclake/checkpoints/<name>
    kafka:
      bootstrap_servers: broker1:9092,broker2:9092
      topics: [dw.crm, dw.shop]                    # or: topic_pattern: "dw\\..*"
      starting_offsets: earliest                   # earliest | latest (only for a new checkpoint)
      max_offsets_per_trigger: 200000
      options:                                     # passed to Spark's Kafka source ("kafka." prefix optional)
        security.protocol: SASL_SSL
        sasl.jaas.config: ...
    format: dataworks-json                         # default format of every topic
    topic_formats: {dw.legacy: dataworks-json}     # per-topic override
    tables: {include: ["shop.*", crm.customer], exclude: ["*.tmp_*"]}   # tables to land (globs; default all)
    routes:                                        # lake table of a source table (default <database>/<table>)
      - {tables: ["shop.orders_*"], to: shop.orders}          # merge shards into one lake table
      - {tables: ["crm.*"], to: "ods.crm_{table}"}            # rename; placeholders {database} {schema} {table}
    keys: {crm.audit_log: [id], "shop.orders_*": [order_id]}   # key columns for tables whose messages carry none
    ddl: {policy: evolve, tables: {crm.audit_log: ignore}}   # DDL statements: evolve | ignore | fail
    #   ddl.online_schema_change: true  -> gh-ost / pt-online-schema-change: keep the table, apply the ghost's changes
    sequence_by: {shop.orders: version}            # order a table's changes by a column instead of the log position
    kafka_order: timestamp                         # order changes without a position by Kafka record time (README)
    column_types: {dts.orders: {amount: "decimal(12,2)"}}   # types the messages do not carry (README: Formats)
    # keys, ddl.tables, sequence_by, column_types and history take names or patterns; the most specific match wins
    trigger: {processing_time: 10 seconds}         # or {available_now: true}: stop when caught up
    history:                                       # optional history tables (README: History tables)
      changelog: true                              # every table, or a list: [crm.customer, shop.orders]
      scd2: [crm.customer]
    transactions: {consistent: true}               # apply only complete source transactions (README)
    deletion_vectors: auto                         # auto | always | never (README: Deletion vectors)
    table_format: delta                            # delta | iceberg (README: Iceberg lake tables)
    table_properties: {"shop.*": {delta.enableChangeDataFeed: true}}   # lake tables' own properties (README)
    partition_by: {shop.orders: [region]}          # partitioning of the lake tables cdclake creates (README)
    iceberg_catalog: glue                          # iceberg: a Spark catalog of the session (default: at `lake`)
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cdclake import model
from cdclake.exceptions import ConfigError, UnknownFormatError
from cdclake.model import KafkaOrder
from cdclake.tables import (
    GHOST_TABLES,
    TRASH_TABLES,
    OnlineSchemaChange,
    TableFilter,
    TableRoutes,
    check_helper_template,
    check_pattern,
    check_target,
)

SECRET_KEY = re.compile(r"password|secret|jaas|token|credential|(^|\.)key($|\.)|keystore|truststore", re.IGNORECASE)


FIXES: dict[str, str] = {
    "lake": "set `lake:` to the directory (or URI) of the lake, e.g. `lake: /data/lake`",
    "kafka": "add a `kafka:` section with `bootstrap_servers` and `topics` (or `topic_pattern`)",
    "kafka.bootstrap_servers": "set `bootstrap_servers: host:port[,host:port]` under `kafka:`",
    "kafka.topics": "give `topics: [name, ...]` or `topic_pattern: <regex>` under `kafka:` (exactly one of them)",
    "kafka.starting_offsets": "use `earliest` or `latest`",
    "kafka.max_offsets_per_trigger": "use a positive integer, e.g. 200000",
    "format": "set `format:` to a name listed by `cdclake formats`",
    "topic_formats": "map each topic to a name listed by `cdclake formats`",
    "trigger": "use `trigger: {processing_time: 10 seconds}` or `trigger: {available_now: true}`",
    "trigger.processing_time": "write it as Spark does, e.g. `10 seconds`, `1 minute 30 seconds`, `500 milliseconds`",
    "tables": 'use `tables: {include: [shop.*, crm.customer], exclude: ["*.tmp_*"]}`: lists of `db.table` '
    "(or `table`, `db.schema.table`) patterns where `*` matches any characters and `?` one",
    "routes": 'use `routes: [{tables: ["shop.orders_*"], to: shop.orders}]`: a list of rules, each with `tables` '
    "(patterns as in `tables.include`) and `to` (`db.table` or `table`, with `{database}`, `{schema}`, `{table}` "
    "placeholders); the first rule that matches a table names its lake table",
    "keys": "map `db.table` (or `table`, or a pattern such as `shop.orders_*`) to a list of column names, e.g. "
    "`keys: {crm.audit_log: [id]}`",
    "sequence_by": "map `db.table`, `table` or a pattern (`*` for every table) to the column that orders changes, "
    "e.g. `{shop.orders: version}`",
    "column_types": "map `db.table` (or `table`, or a pattern) to its columns' types, e.g. "
    '`column_types: {shop.orders: {amount: "decimal(12,2)"}}` (boolean, tinyint, smallint, int, bigint, float, '
    "double, decimal(p,s), string, date or timestamp_ntz)",
    "ddl": "use `ddl: {policy: evolve|ignore|fail, tables: {db.table: evolve|ignore|fail}}` (tables may be patterns)",
    "ddl.online_schema_change": "use `online_schema_change: true` under `ddl:` (gh-ost and pt-online-schema-change "
    "names), or `{ghost_tables: [_{table}_gho], trash_tables: [_{table}_del]}`: table names with `{table}` once",
    "history": "use `history: {changelog: true, scd2: [crm.customer]}`: `true` for every table, `false` for none, "
    "or a list of `db.table` names or patterns",
    "deletion_vectors": "use `auto` (switch a table once its MERGEs rewrite enough), `always` or `never`",
    "table_format": "use `delta` (default) or `iceberg`",
    "kafka_order": "use `timestamp` (Kafka record time, then partition and offset) or `partition` (partition, then "
    "offset); leave it out to keep the order the lake records",
    "table_properties": "map `db.table` (or `table`, or a pattern such as `shop.*`) to the lake table's properties, "
    'e.g. `table_properties: {"shop.*": {delta.enableChangeDataFeed: true}}`',
    "partition_by": "map `db.table` (or `table`, or a pattern such as `shop.*`) to a list of partition columns, e.g. "
    "`partition_by: {shop.orders: [region]}` (Iceberg also takes `days(created_at)`, `bucket(16, id)`...)",
    "iceberg_catalog": "name a Spark catalog that the session configures (`spark.sql.catalog.<name>`), "
    "or leave it out for an Iceberg catalog at `lake`",
    "transactions": (
        "use `transactions: {consistent: true}`, optionally with the limits `max_open_seconds: 600` and "
        "`max_pending_messages: 100000` (both > 0)"
    ),
}

DEFAULT_TRANSACTION_MAX_OPEN_SECONDS = 600.0
"""Transaction-consistent mode: a transaction open longer than this (source event time) is applied anyway."""
DEFAULT_TRANSACTION_MAX_PENDING_MESSAGES = 100_000
"""Transaction-consistent mode: a transaction holding back more messages than this is applied anyway."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaConfig(_Strict):
    """Where to read."""

    bootstrap_servers: str = Field(min_length=1)
    topics: list[str] | None = None
    topic_pattern: str | None = None
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    max_offsets_per_trigger: int | None = Field(default=200_000, gt=0)
    fail_on_data_loss: bool = True
    options: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_subscription(self) -> KafkaConfig:
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("give exactly one of `topics` and `topic_pattern`")
        if self.topic_pattern is not None:
            re.compile(self.topic_pattern)
        if any(key.lower() == "includeheaders" for key in self.options):
            raise ValueError(
                "`options.includeHeaders` is cdclake's own: it always reads the records' headers (Debezium names a "
                "primary-key update's other key there); remove it"
            )
        return self

    def spark_options(self) -> dict[str, str]:
        """Options for ``spark.readStream.format("kafka")``."""
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "startingOffsets": self.starting_offsets,
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            "includeHeaders": "true",
        }
        if self.topics:
            options["subscribe"] = ",".join(self.topics)
        else:
            options["subscribePattern"] = str(self.topic_pattern)
        if self.max_offsets_per_trigger:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        for key, value in self.options.items():
            spark_key = key if key.startswith("kafka.") or not _is_kafka_client_key(key) else f"kafka.{key}"
            options[spark_key] = value
        return options

    def redacted_options(self) -> dict[str, str]:
        """:meth:`spark_options` with secret values replaced, for printing."""
        return {k: ("***" if SECRET_KEY.search(k) else v) for k, v in self.spark_options().items()}


def _is_kafka_client_key(key: str) -> bool:
    # Spark's own source options are camelCase words; Kafka client settings are dotted lower-case.
    return "." in key


_INTERVAL: Final = re.compile(
    r"\s*(interval\s+)?(\d+(\.\d+)?\s+(microsecond|millisecond|second|minute|hour|day|week)s?\s*)+", re.IGNORECASE
)
"""What Spark's processing-time trigger reads (``IntervalUtils.stringToInterval``; months and years refused): a
number and a unit, repeatable. ``10 secs``, ``10s`` or ``1 min`` stopped ``run`` at its start with Spark's error."""


class TriggerConfig(_Strict):
    """When micro-batches run."""

    processing_time: str | None = "10 seconds"
    available_now: bool = False

    @field_validator("processing_time")
    @classmethod
    def _interval(cls, value: str | None) -> str | None:
        if value is not None and not _INTERVAL.fullmatch(value):
            raise ValueError(f"{value!r} is not an interval: a number and a unit (second, minute, hour...), spelt out")
        return value


class OnlineSchemaChangeConfig(_Strict):
    """The helper tables of online schema change tools (cdclake.tables.OnlineSchemaChange): names with ``{table}``."""

    ghost_tables: list[str] = Field(default_factory=lambda: list(GHOST_TABLES))
    trash_tables: list[str] = Field(default_factory=lambda: list(TRASH_TABLES))

    @field_validator("ghost_tables", "trash_tables")
    @classmethod
    def _templates(cls, value: list[str]) -> list[str]:
        for template in value:
            problem = check_helper_template(template)
            if problem is not None:
                raise ValueError(problem)
        return value


class DdlConfig(_Strict):
    """What DDL statements from the source do to lake tables (see cdclake.evolve)."""

    policy: Literal["evolve", "ignore", "fail"] = "evolve"
    tables: dict[str, Literal["evolve", "ignore", "fail"]] = Field(default_factory=dict)
    online_schema_change: OnlineSchemaChangeConfig | None = None
    """``true`` for the helper table names of gh-ost and pt-online-schema-change; off by default."""

    @field_validator("tables")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        return _checked_names(value)

    @field_validator("online_schema_change", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        if value is True:
            return {}
        return None if value is False else value

    def online(self) -> OnlineSchemaChange | None:
        setting = self.online_schema_change
        if setting is None:
            return None
        return OnlineSchemaChange(tuple(setting.ghost_tables), tuple(setting.trash_tables))


def _checked_patterns(value: list[str]) -> list[str]:
    for pattern in value:
        problem = check_pattern(pattern)
        if problem is not None:
            raise ValueError(problem)
    return value


_Setting = TypeVar("_Setting")


def _property_text(value: Any) -> Any:
    """A YAML scalar as the text a table property holds (``true``, not Python's ``True``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else value


RETYPE_TARGETS: Final = tuple(sorted(model.SIMPLE_SPARK_TYPES - {"binary", "timestamp"}))
"""The types ``column_types`` may give a column (and ``decimal(p,s)``): those whose canonical text (cdclake.model) is
the value's plain text. ``timestamp`` (epoch microseconds) and ``binary`` (base64) are not among them: a column's
text would not be that."""
_RETYPE_ALIASES: Final = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint", "real": "float"}
_RETYPE_DECIMAL: Final = re.compile(r"(?:decimal|numeric)\((\d+),(\d+)\)")


def checked_column_types(table: str, columns: dict[str, str]) -> dict[str, str]:
    """One table's ``column_types`` entry with its types spelled by :func:`retype_target`; ValueError naming the
    table for a column named twice (in any case) or a type that cannot be given."""
    lowered = [column.lower() for column in columns]
    if len(set(lowered)) < len(lowered):
        raise ValueError(f"table {table} names a column twice (names are compared case-insensitively)")
    try:
        return {column: retype_target(column, kind) for column, kind in columns.items()}
    except ValueError as exc:
        raise ValueError(f"table {table}, {exc}") from None


def retype_target(column: str, spark_type: str) -> str:
    """``spark_type`` as cdclake spells it (``DECIMAL(12, 2)`` -> ``decimal(12,2)``); ValueError naming ``column``
    when it is not a type that ``column_types`` can give."""
    spelled = re.sub(r"\s+", "", str(spark_type)).lower()
    spelled = _RETYPE_ALIASES.get(spelled, spelled)
    if spelled in RETYPE_TARGETS:
        return spelled
    if (match := _RETYPE_DECIMAL.fullmatch(spelled)) and int(match[1]) > 0:
        decimal = f"decimal({int(match[1])},{int(match[2])})"
        if model.is_supported_spark_type(decimal):
            return decimal
    raise ValueError(
        f"column {column}: '{spark_type}' is not a type column_types can give; use one of "
        f"{', '.join(RETYPE_TARGETS)} or decimal(p,s) with 1 <= p <= 38 and s <= p"
    )


def _checked_names(value: dict[str, _Setting]) -> dict[str, _Setting]:
    """The table names or patterns of a per-table setting (cdclake.tables.PerTable), checked."""
    _checked_patterns(list(value))
    return value


class TablesConfig(_Strict):
    """Which source tables land in the lake (cdclake.tables): glob patterns; every table when ``include`` is empty."""

    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return _checked_patterns(value)

    def table_filter(self) -> TableFilter:
        return TableFilter.of(self.include, self.exclude)


class RouteConfig(_Strict):
    """One ``routes`` rule (cdclake.tables.TableRoute): the tables matching ``tables`` land in lake table ``to``."""

    tables: list[str] = Field(min_length=1)
    to: str

    @field_validator("tables", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("tables")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return _checked_patterns(value)

    @field_validator("to")
    @classmethod
    def _target(cls, value: str) -> str:
        problem = check_target(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class HistoryTablesConfig(_Strict):
    """Which tables get history tables (cdclake.sinks.history): true = all, false = none, or ``db.table`` names."""

    changelog: bool | list[str] = False
    scd2: bool | list[str] = False

    @field_validator("changelog", "scd2", mode="before")
    @classmethod
    def _all_or_table_names(cls, value: Any) -> Any:
        # Checked before pydantic's union, whose errors would name a union member instead of the key.
        if isinstance(value, bool):
            return value
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            raise ValueError("expected true, false or a list of table names")
        # The names and patterns of `tables.include`, checked alike: a source name may itself hold a dot
        # (`shop.orders.v2`), so the number of parts is not limited.
        return _checked_patterns(value)


class TransactionsConfig(_Strict):
    """Transaction-consistent mode: where the format marks transaction boundaries, a batch applies only complete
    source transactions; an open one is held back (at most ``max_open_seconds`` of source time and
    ``max_pending_messages`` messages, then applied anyway with a warning)."""

    consistent: bool = False
    max_open_seconds: float = Field(default=DEFAULT_TRANSACTION_MAX_OPEN_SECONDS, gt=0)
    max_pending_messages: int = Field(default=DEFAULT_TRANSACTION_MAX_PENDING_MESSAGES, gt=0)


class PipelineConfig(_Strict):
    """A ``cdclake run`` configuration file."""

    name: str = Field(default="cdclake", pattern=r"^[A-Za-z0-9_.\-]+$")
    lake: str = Field(min_length=1)
    checkpoint: str | None = None
    kafka: KafkaConfig
    format: str | None = None
    topic_formats: dict[str, str] = Field(default_factory=dict)
    format_options: dict[str, dict[str, str]] = Field(default_factory=dict)
    tables: TablesConfig = Field(default_factory=TablesConfig)
    routes: list[RouteConfig] = Field(default_factory=list)
    keys: dict[str, list[str]] = Field(default_factory=dict)
    trigger: TriggerConfig = Field(default_factory=TriggerConfig)
    tombstone_retention_hours: float = Field(default=168.0, gt=0)
    deletion_vectors: Literal["auto", "always", "never"] = "auto"
    table_format: Literal["delta", "iceberg"] = "delta"
    iceberg_catalog: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    table_properties: dict[str, dict[str, str]] = Field(default_factory=dict)
    partition_by: dict[str, list[str]] = Field(default_factory=dict)
    kafka_order: KafkaOrder | None = None
    ddl: DdlConfig = Field(default_factory=DdlConfig)
    sequence_by: dict[str, str] = Field(default_factory=dict)
    column_types: dict[str, dict[str, str]] = Field(default_factory=dict)
    history: HistoryTablesConfig = Field(default_factory=HistoryTablesConfig)
    transactions: TransactionsConfig = Field(default_factory=TransactionsConfig)
    spark: dict[str, str] = Field(default_factory=dict)

    def table_routes(self) -> TableRoutes:
        return TableRoutes.of((rule.tables, rule.to) for rule in self.routes)

    @field_validator("keys")
    @classmethod
    def _keys_not_empty(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for table, columns in value.items():
            if not columns:
                raise ValueError(f"table {table} has an empty key list")
        return _checked_names(value)

    @field_validator("sequence_by")
    @classmethod
    def _sequence_tables(cls, value: dict[str, str]) -> dict[str, str]:
        return _checked_names(value)

    @field_validator("column_types", mode="before")
    @classmethod
    def _quoted_decimals(cls, value: Any) -> Any:
        # YAML ends a value at a comma inside {...}: `{amount: decimal(12,2)}` reads as `decimal(12` and a key `2)`.
        for table, columns in value.items() if isinstance(value, dict) else ():
            for column, kind in columns.items() if isinstance(columns, dict) else ():
                if kind is None and str(column).endswith(")"):
                    raise ValueError(
                        f'table {table}: quote a decimal type inside {{...}}, e.g. {{amount: "decimal(12,2)"}} (YAML '
                        "ends a value at the comma)"
                    )
        return value

    @field_validator("column_types")
    @classmethod
    def _column_types(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        checked: dict[str, dict[str, str]] = {}
        for table, columns in value.items():
            if not columns:
                raise ValueError(f"table {table} has no columns")
            checked[table] = checked_column_types(table, columns)
        return _checked_names(checked)

    @field_validator("table_properties", mode="before")
    @classmethod
    def _property_values_as_text(cls, value: Any) -> Any:
        # Table properties are text; YAML reads `true` and `30` as a boolean and a number.
        if not isinstance(value, dict):
            return value
        return {
            table: {k: _property_text(v) for k, v in properties.items()} if isinstance(properties, dict) else properties
            for table, properties in value.items()
        }

    @field_validator("table_properties")
    @classmethod
    def _property_tables(cls, value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for table, properties in value.items():
            if not properties:
                raise ValueError(f"table {table} has no properties")
        return _checked_names(value)

    @field_validator("partition_by", mode="before")
    @classmethod
    def _one_or_more_fields(cls, value: Any) -> Any:
        # `partition_by: {shop.orders: region}` for a single column.
        if not isinstance(value, dict):
            return value
        return {table: [fields] if isinstance(fields, str) else fields for table, fields in value.items()}

    @field_validator("partition_by")
    @classmethod
    def _partition_tables(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        return _checked_names(value)

    @model_validator(mode="after")
    def _formats_known(self) -> PipelineConfig:
        from cdclake.formats import get_format

        if self.format is None and not self.topic_formats:
            raise ValueError("no format: set `format` (all topics) or `topic_formats`")
        topics = self.kafka.topics or []
        if topics and (unknown := sorted(set(self.topic_formats) - set(topics))):
            raise ValueError(f"topic_formats names topics that are not in kafka.topics: {', '.join(unknown)}")
        if topics and (unread := [t for t in topics if self.format is None and t not in self.topic_formats]):
            raise ValueError(f"topics without a format: {', '.join(unread)}")
        if self.format is not None:
            try:
                get_format(self.format)
            except UnknownFormatError as exc:
                raise ValueError(str(exc)) from None
        for topic, name in self.topic_formats.items():
            try:
                get_format(name)
            except UnknownFormatError as exc:
                raise ValueError(f"{exc} (for topic {topic} in topic_formats)") from None
        return self

    @model_validator(mode="after")
    def _iceberg_settings(self) -> PipelineConfig:
        if self.table_format != "iceberg" and self.iceberg_catalog is not None:
            raise ValueError("iceberg_catalog is only used with `table_format: iceberg`")
        return self

    @field_validator("lake", "checkpoint")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        return None if value is None else absolute_location(value)

    @property
    def checkpoint_location(self) -> str:
        return self.checkpoint or f"{self.lake.rstrip('/')}/_cdclake/checkpoints/{self.name}"


_URI_SCHEME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


def absolute_location(path: str) -> str:
    """A lake or checkpoint location for Spark: a local path made absolute, a URI (``s3a://``, ``hdfs://``,
    ``file:/``) as given. Delta reads ``delta.`lake/t``` as a path only when it is absolute: with a relative lake,
    each statement that names a table by its path failed (``SCHEMA_NOT_FOUND``: ``spark_catalog.delta``)."""
    if _URI_SCHEME.match(path):
        return path
    return os.path.abspath(path)


def _fix_for(location: str) -> str:
    for key in sorted(FIXES, key=len, reverse=True):
        if location == key or location.startswith(key + "."):
            return FIXES[key]
    return "see the example configuration in the README (Use: Stream from Kafka) or atop the cdclake.config module"


_CROSS_KEY_PROBLEMS: dict[str, tuple[str, str]] = {
    "iceberg_catalog is only used": ("iceberg_catalog", "remove it, or set `table_format: iceberg`"),
    # Without a format, a topic's messages would be read and never applied.
    "topics without a format": (
        "topic_formats",
        "map each of them to a name listed by `cdclake formats`, or set `format:` for the topics not listed",
    ),
    "not in kafka.topics": ("topic_formats", "correct the topic's name, or add it to kafka.topics"),
    "in topic_formats)": ("topic_formats", "map each topic to a name listed by `cdclake formats`"),
}
"""Problems of a combination of keys (pydantic reports a model validator's error at the root): a phrase of the
problem -> the key to name and its fix."""


def parse_config(data: Any, source: str = "config") -> PipelineConfig:
    """Validates a parsed YAML document; raises :class:`ConfigError` for the first problem."""
    if not isinstance(data, dict):
        raise ConfigError("<root>", f"{source} must be a YAML mapping", "start from the example in the README")
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt key is also a missing one (`bootstrap_server`): name the unknown key, the cause, first.
        error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        location = ".".join(str(part) for part in error["loc"]) or "<root>"
        # pydantic words a validator's ValueError as "Value error, <its text>": the text is the problem.
        problem = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            raise ConfigError(location, "unknown key", _unknown_key_fix(error["loc"], errors)) from None
        if error["type"] == "missing":
            problem = "required key is missing"
        for marker, (key, key_fix) in _CROSS_KEY_PROBLEMS.items():
            if location == "<root>" and marker in problem:
                raise ConfigError(key, problem, key_fix) from None
        fix = _fix_for(location)
        if location in ("<root>", "kafka") and "format" in problem:
            fix, location = FIXES["format"], "format"
        if "topics" in problem and location == "kafka":
            location, fix = "kafka.topics", FIXES["kafka.topics"]
        raise ConfigError(location, problem, fix) from None
    from cdclake.formats import check_options

    check_options(config.format_options)
    from cdclake.sinks import check_table_properties

    check_table_properties(config.table_properties, config.table_format)
    from cdclake.sinks.partitioning import check_partition_by

    check_partition_by(config.partition_by, config.table_format)
    return config


def _unknown_key_fix(where: tuple[int | str, ...], errors: list[Any]) -> str:
    """The fix for an unknown key: the missing key of the same section it most looks like, when there is one."""
    missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and e["loc"][:-1] == where[:-1]]
    close = difflib.get_close_matches(str(where[-1]), missing, n=1, cutoff=0.6)
    if close:
        return f"did you mean `{close[0]}`? Rename it (see the README for every key)"
    return "remove it or check its spelling (see the README for every key)"


def load_config(path: str | Path) -> PipelineConfig:
    """Reads and validates a YAML configuration file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            "<file>", f"cannot read {path}: {exc.strerror}", "pass the path of a readable YAML file"
        ) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("<file>", f"{path} is not valid YAML: {exc}", "fix the YAML syntax") from exc
    return parse_config(data, str(path))
