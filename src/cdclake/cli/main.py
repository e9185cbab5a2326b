"""``cdclake run | replay | status | formats | dlq list | dlq replay``.

Exit codes: 0 success; 1 a cdclake error (bad config, unreadable input, missing jars), with its message on
stderr; 2 bad command-line usage.
"""

from __future__ import annotations

import base64
import inspect
import logging
import os
import re
import sys
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cdclake.exceptions import CdclakeError, ConfigError, InputError
from cdclake.tables import OnlineSchemaChange, TableFilter, TableRoutes, check_pattern, check_target

if TYPE_CHECKING:
    from cdclake.check import CheckReport
    from cdclake.config import PipelineConfig
    from cdclake.dlq import DeadLetter, DeadLetterFilter

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Land CDC streams from Kafka in Delta Lake or Apache Iceberg tables.",
)
dlq_app = typer.Typer(
    no_args_is_help=True, help="Dead letters: list them, and re-apply them once the cause is fixed (each at most once)."
)
app.add_typer(dlq_app, name="dlq")
PIPED_WIDTH = 1_000


def _console(*, stderr: bool = False) -> Console:
    """A terminal wraps to its width; piped or redirected output (scripts, CI logs) gets one table row per line,
    never cut at rich's default of 80 columns. ``COLUMNS`` still wins when set.

    No markup or emoji codes: what is printed holds text from messages, configurations and errors (table and column
    names, patterns such as ``cdc.[a-z]*``, raw values), which rich would otherwise read as style tags and drop."""
    console = Console(stderr=stderr, markup=False, emoji=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPED_WIDTH
    return console


out = _console()
err = _console(stderr=True)


def _parse_keys(values: list[str]) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for value in values:
        table, sep, columns = value.partition("=")
        names = [c.strip() for c in columns.split(",") if c.strip()]
        if not sep or not table.strip() or not names:
            raise InputError(f"--keys {value!r}: expected db.table=col1,col2 (the table may be a pattern)")
        keys[_table_name("--keys", table.strip())] = names
    return keys


def _parse_sequence_by(values: list[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        table, sep, column = value.partition("=")
        if not sep or not table.strip() or not column.strip():
            raise InputError(f"--sequence-by {value!r}: expected db.table=column, e.g. shop.orders=version")
        pairs[_table_name("--sequence-by", table.strip())] = column.strip()
    return pairs


def _parse_column_types(values: list[str]) -> dict[str, dict[str, str]]:
    from cdclake.config import retype_target

    column_types: dict[str, dict[str, str]] = {}
    for value in values:
        target, sep, spark_type = value.partition("=")
        table, dot, column = target.strip().rpartition(".")
        if not sep or not dot or not table or not column or not spark_type.strip():
            raise InputError(
                f"--column-type {value!r}: expected db.table.column=type, e.g. shop.orders.amount=decimal(12,2) "
                "(the table may be a pattern)"
            )
        try:
            spelled = retype_target(column, spark_type.strip())
        except ValueError as exc:
            raise InputError(f"--column-type {value!r}: {exc}") from None
        column_types.setdefault(_table_name("--column-type", table), {})[column] = spelled
    return column_types


def _parse_partition_by(values: list[str]) -> dict[str, list[str]]:
    partition_by: dict[str, list[str]] = {}
    for value in values:
        table, sep, fields = value.partition("=")
        # A comma inside parentheses belongs to a transform: bucket(16, id).
        names = [f.strip() for f in re.split(r",(?![^(]*\))", fields) if f.strip()]
        if not sep or not table.strip() or not names:
            raise InputError(
                f"--partition-by {value!r}: expected db.table=col1,col2 (the table may be a pattern; Iceberg also "
                "takes transforms: shop.orders=days(created_at))"
            )
        partition_by[_table_name("--partition-by", table.strip())] = names
    return partition_by


def _table_name(option: str, name: str) -> str:
    """A table name or pattern of a per-table option, checked."""
    problem = check_pattern(name)
    if problem is not None:
        raise InputError(f"{option}: {problem}")
    return name


def _table_filter(include: list[str], exclude: list[str]) -> TableFilter:
    for option, patterns in (("--include-table", include), ("--exclude-table", exclude)):
        for pattern in patterns:
            _table_name(option, pattern)
    return TableFilter.of(include, exclude)


def _table_routes(values: list[str]) -> TableRoutes:
    """``--route PATTERN=TARGET`` values, in order (the first matching rule names a table's lake table)."""
    rules: list[tuple[list[str], str]] = []
    for value in values:
        pattern, sep, target = value.partition("=")
        problem = check_pattern(pattern.strip()) if sep else "expected PATTERN=TARGET"
        problem = problem or check_target(target.strip())
        if problem is not None:
            raise InputError(f"--route {value!r}: {problem}, e.g. --route 'shop.orders_*=shop.orders'")
        rules.append(([pattern.strip()], target.strip()))
    return TableRoutes.of(rules)


def _table_selection(values: list[str]) -> bool | list[str]:
    """``--changelog``/``--scd2`` values: ``all`` selects every table; otherwise the table names."""
    if any(value.strip().lower() == "all" for value in values):
        return True
    return [value.strip() for value in values if value.strip()] or False


def _parse_options(values: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep or not name.strip():
            raise ConfigError(
                "--option", f"{value!r} is not name=value", "write --option name=value (`cdclake formats` lists them)"
            )
        options[name.strip()] = setting
    return options


def _refuse_with_config(config: str, adding: str, given: dict[str, bool]) -> None:
    """With ``--config`` the settings come from the pipeline's file: the options among ``given`` that were set
    would contradict it (``adding``: the options that add to it instead)."""
    if clashing := [name for name, is_set in given.items() if is_set]:
        raise InputError(
            f"{', '.join(clashing)}: --config gives the pipeline's settings; change them in {config}, or drop "
            f"--config and give every setting as an option ({adding} add to the configuration's)"
        )


ConfigOption = Annotated[
    str | None,
    typer.Option("--config", help="A pipeline's configuration (YAML): its lake, table format and Spark settings."),
]


def _lake_of(
    lake: str | None, config: str | None, given: dict[str, bool] | None = None, adding: str = "the filters"
) -> tuple[str, PipelineConfig | None]:
    """The lake a command works on, from ``--lake`` or from a pipeline's ``--config`` (then with that
    configuration); ``given``: the command's other options that the configuration settles, ``adding``: those that
    add to it."""
    if config is None:
        if lake is None:
            raise InputError("give the lake: --lake DIR, or --config with a pipeline's configuration")
        from cdclake.config import absolute_location

        return absolute_location(lake), None
    from cdclake.config import load_config

    _refuse_with_config(config, adding, {"--lake": lake is not None, **(given or {})})
    cfg = load_config(config)
    return cfg.lake, cfg


IncludeTableOption = Annotated[
    list[str] | None,
    typer.Option(help="Land only tables matching this pattern (db.table, * and ? wildcards); repeatable."),
]
ExcludeTableOption = Annotated[
    list[str] | None,
    typer.Option(help="Leave out tables matching this pattern (db.table, * and ? wildcards); repeatable."),
]
RouteOption = Annotated[
    list[str] | None,
    typer.Option(
        help="Land the tables matching PATTERN in lake table TARGET: PATTERN=TARGET, TARGET db.table or table, "
        "with {database} {schema} {table} placeholders; repeatable, the first match wins."
    ),
]

SequenceByOption = Annotated[
    list[str] | None,
    typer.Option(help="Order a table's changes by a column instead of the log position: db.table=column."),
]

ColumnTypeOption = Annotated[
    list[str] | None,
    typer.Option(
        help="Declare a column's type where the messages do not carry it: db.table.column=decimal(12,2) "
        "(types: README Formats); repeatable."
    ),
]

OnlineSchemaChangeOption = Annotated[
    bool,
    typer.Option(
        "--online-schema-change",
        help="gh-ost / pt-online-schema-change: ghost and helper tables do not land; the cut-over applies the "
        "ghost's changes to the table (as the pipeline's ddl.online_schema_change).",
    ),
]


@app.command()
def formats() -> None:
    """List every registered format with its operations and options."""
    from cdclake.formats import list_formats

    table = Table("format", "encoding", "description", "vendor operations -> canonical", "options")
    for fmt in list_formats():
        ops = ", ".join(f"{vendor}->{op.value}" for vendor, op in fmt.operations.items())
        options = "; ".join(f"{k}: {v}" for k, v in fmt.options.items()) or "-"
        table.add_row(fmt.name, fmt.encoding, fmt.description, ops, options)
    out.print(table)


@app.command()
def replay(
    files: Annotated[
        list[str],
        typer.Argument(
            help="Capture files, applied in this order: paths, directories (their files in name order) or URIs that "
            "Spark reads (hdfs://, s3a://; a directory or glob there too)."
        ),
    ],
    format_name: Annotated[
        str | None,
        typer.Option(
            "--format", help="Format name (see `cdclake formats`), or `auto` to recognise it from the first messages."
        ),
    ] = None,
    lake: LakeOption = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="A pipeline's configuration (YAML): replay with its lake, format and options, keys, tables, routes, "
            "DDL, sequence_by, transactions, history tables, table format and Spark settings.",
        ),
    ] = None,
    input_encoding: Annotated[
        str,
        typer.Option(
            help="lines: one JSON message per line; b64: one base64 binary message per line; records: one Kafka "
            "record per line, a JSON object with the message and its key, timestamp and headers (kcat -J output, "
            "or key/value/timestamp/headers; README: Replay captured messages)."
        ),
    ] = "lines",
    keys: Annotated[
        list[str] | None,
        typer.Option(help="Key columns for a table whose messages carry none: db.table=c1,c2"),
    ] = None,
    include_table: IncludeTableOption = None,
    exclude_table: ExcludeTableOption = None,
    route: RouteOption = None,
    batch_lines: Annotated[
        int, typer.Option(min=1, help="Lines per batch (each a message; blank lines, which are skipped, count too).")
    ] = 1_000_000,
    ddl_policy: Annotated[
        str | None, typer.Option(help="What DDL statements do to lake tables: evolve (default), ignore or fail.")
    ] = None,
    online_schema_change: OnlineSchemaChangeOption = False,
    transaction_consistent: Annotated[
        bool,
        typer.Option(
            "--transaction-consistent",
            help="Apply only complete source transactions (formats that mark them); hold open ones back.",
        ),
    ] = False,
    option: Annotated[
        list[str] | None, typer.Option("--option", help="A format option, name=value (see `cdclake formats`).")
    ] = None,
    sequence_by: SequenceByOption = None,
    column_type: ColumnTypeOption = None,
    partition_by: Annotated[
        list[str] | None,
        typer.Option(
            help="Partition the lake table cdclake creates for a table: db.table=c1,c2 (Iceberg also takes "
            "transforms: days(c), bucket(16, c)...)."
        ),
    ] = None,
    changelog: Annotated[
        list[str] | None,
        typer.Option(help="Keep a changelog table for this table (db.table), or `all`; repeatable."),
    ] = None,
    scd2: Annotated[
        list[str] | None,
        typer.Option(help="Keep an SCD type 2 history table for this table (db.table), or `all`; repeatable."),
    ] = None,
    deletion_vectors: Annotated[
        str | None,
        typer.Option(
            help="When lake and history tables use Delta deletion vectors: auto (default: once their MERGEs rewrite "
            "enough), always, never."
        ),
    ] = None,
    table_format: DefaultTableFormatOption = None,
    iceberg_catalog: IcebergCatalogOption = None,
    kafka_order: Annotated[
        str | None,
        typer.Option(
            help="The order of changes whose format carries no position (Canal, DTS Canal JSON, Lindorm...): "
            "partition (the file order) or timestamp (the records' timestamps, for a capture that interleaves "
            "several Kafka partitions, such as a kcat dump of a whole topic; the lake keeps it from then on). "
            "Default: the lake's recorded order, else partition. README: Ordering across Kafka partitions.",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Decode every message and report as `check` does (the tables, where they land, their keys, the "
            "messages that would be dead letters with their file and line); write nothing. Exits 1 if a message "
            "would be a dead letter.",
        ),
    ] = False,
) -> None:
    """Apply captured messages from files, in file order, through the same decode and apply path as `run`."""
    from cdclake.sources.files import INPUT_ENCODINGS, check_files

    if input_encoding not in INPUT_ENCODINGS:
        raise InputError(f"--input-encoding must be 'lines', 'b64' or 'records', not {input_encoding!r}")
    from cdclake.formats import check_options, get_format
    from cdclake.pipeline import BatchResult
    from cdclake.runner import file_replay_settings, replay_files, replay_settings

    key_map = _parse_keys(keys or [])
    format_options = _parse_options(option or [])
    tables = _table_filter(include_table or [], exclude_table or [])
    routes = _table_routes(route or [])
    sequence_map = _parse_sequence_by(sequence_by or [])
    column_type_map = _parse_column_types(column_type or [])
    partition_map = _parse_partition_by(partition_by or [])
    if format_name not in (None, "auto"):
        get_format(format_name)
    files = check_files(files)
    settled = {
        "--include-table": bool(include_table),
        "--exclude-table": bool(exclude_table),
        "--route": bool(route),
        "--ddl-policy": ddl_policy is not None,
        "--online-schema-change": online_schema_change,
        "--transaction-consistent": transaction_consistent,
        "--sequence-by": bool(sequence_by),
        "--column-type": bool(column_type),
        "--partition-by": bool(partition_by),
        "--changelog": bool(changelog),
        "--scd2": bool(scd2),
        "--deletion-vectors": deletion_vectors is not None,
        "--table-format": table_format is not None,
        "--iceberg-catalog": iceberg_catalog is not None,
        "--kafka-order": kafka_order is not None,
    }
    lake, cfg = _lake_of(lake, config, settled, adding="--format, --keys and --option")
    if cfg is not None:
        format_name = format_name or cfg.format  # the configuration's format is checked when it is loaded
        if format_name is None:
            raise InputError(f"{config} names no single `format` (only `topic_formats`): give --format NAME")
    else:
        if format_name is None:
            raise InputError("give --format NAME (or --config with a pipeline's configuration)")
        if ddl_policy not in (None, "evolve", "ignore", "fail"):
            raise InputError(f"--ddl-policy must be 'evolve', 'ignore' or 'fail', not {ddl_policy!r}")
        if deletion_vectors not in (None, "auto", "always", "never"):
            raise InputError(f"--deletion-vectors must be 'auto', 'always' or 'never', not {deletion_vectors!r}")
        if kafka_order not in (None, "partition", "timestamp"):
            raise InputError(f"--kafka-order must be 'partition' or 'timestamp', not {kafka_order!r}")
        _check_table_format(table_format or "delta", iceberg_catalog)
        _check_partition_by(partition_map, table_format or "delta")
    if format_name == "auto":
        from cdclake.detect import detect_format, sample_lines

        format_name = detect_format(sample_lines(files, input_encoding))
        err.print(f"--format auto: detected {format_name}")
    check_options({format_name: format_options}, key="--option")
    if cfg is not None:
        settings = replay_settings(cfg, format_name)
        options = {**settings.format_options[format_name], **format_options}
        settings = replace(settings, keys={**settings.keys, **key_map}, format_options={format_name: options})
        spark = _session(cfg.spark)
    else:
        spark = _session()
        settings = file_replay_settings(
            lake=lake,
            format_name=format_name,
            keys=key_map,
            tables=tables,
            routes=routes,
            ddl_policy=ddl_policy or "evolve",  # type: ignore[arg-type]
            online_schema_change=OnlineSchemaChange() if online_schema_change else None,
            transaction_consistent=transaction_consistent,
            format_options=format_options,
            sequence_by=sequence_map,
            column_types=column_type_map,
            partition_by=partition_map,
            changelog=_table_selection(changelog or []),
            scd2=_table_selection(scd2 or []),
            deletion_vectors=deletion_vectors or "auto",  # type: ignore[arg-type]
            table_format=(table_format or "delta"),  # type: ignore[arg-type]
            iceberg_catalog=iceberg_catalog,
            kafka_order=kafka_order,  # type: ignore[arg-type]
        )
    if dry_run:
        from cdclake.check import check_capture

        with out.status("decoding..."):
            report = check_capture(spark, settings, files, input_encoding)
        found = sorted(report.by_topic.items())
        per_file = ": " + ", ".join(f"{path} {count}" for path, count in found) if len(found) <= 5 else ""
        out.print(f"dry run, nothing written: {report.messages} messages decoded from {len(found)} files{per_file}")
        _print_findings(report)
        return
    started = datetime.now(UTC)
    with out.status("replaying...") as status:

        def progress(result: BatchResult) -> None:
            status.update(f"batch {result.batch_id}: {result.messages} events")

        results = replay_files(
            spark,
            settings,
            files,
            encoding=input_encoding,
            batch_lines=batch_lines,
            on_batch=progress,
        )
    lake, table_format, iceberg_catalog = settings.lake, settings.table_format, settings.iceberg_catalog
    _print_summary(spark, lake, results, table_format, iceberg_catalog, started=started)


@app.command()
def status(
    lake: LakeOption = None,
    config: ConfigOption = None,
) -> None:
    """Per table: last position, last source event time and lag; per Kafka partition: last offset."""
    from cdclake.status import lake_status

    lake, cfg = _lake_of(lake, config)
    rows = lake_status(_session(cfg.spark if cfg else None), lake)
    if not rows:
        raise InputError(f"no cdclake progress in {lake} (nothing applied yet, or not a cdclake lake)")
    table = Table("scope", "table / partition", "events", "last position", "last event time", "lag", "last batch at")
    for row in rows:
        table.add_row(*row)
    out.print(table)


@app.command()
def run(
    config: Annotated[str, typer.Argument(help="Pipeline configuration (YAML).")],
    until_caught_up: Annotated[
        bool, typer.Option(help="Stop once every message available at start has been applied.")
    ] = False,
) -> None:
    """Stream from Kafka into the lake (resumes from the checkpoint)."""
    from cdclake.config import load_config
    from cdclake.runner import run as run_stream

    cfg = load_config(config)
    err.print(Text.assemble((cfg.name, "bold"), f": kafka {cfg.kafka.redacted_options()} -> {cfg.lake}"))
    spark = _session(cfg.spark)

    def report(result: object) -> None:
        from cdclake.pipeline import BatchResult

        assert isinstance(result, BatchResult)
        applied = sum(result.applied.values())
        err.print(
            f"batch {result.batch_id}: {result.messages} events, {applied} row changes applied to "
            f"{len(result.applied)} tables, {result.dead_letters} dead letters"
            + (f", {result.excluded} events of excluded tables" if result.excluded else "")
        )

    run_stream(spark, cfg, until_caught_up=until_caught_up, on_batch=report)


@app.command()
def check(
    config: Annotated[str, typer.Argument(help="Pipeline configuration (YAML).")],
    messages: Annotated[int, typer.Option(min=1, help="How many messages to read at most.")] = 1000,
) -> None:
    """Try a configuration on the messages the pipeline would read next: Kafka access, decoding, the tables found,
    where they land and what identifies their rows. Writes nothing; exits 1 if a message would be a dead letter (it
    does not decode, or its row does not meet a CHECK constraint of its lake table)."""
    from cdclake.check import check_pipeline
    from cdclake.config import load_config

    cfg = load_config(config)
    err.print(Text.assemble((cfg.name, "bold"), f": kafka {cfg.kafka.redacted_options()} -> {cfg.lake}"))
    with out.status("reading and decoding..."):
        report = check_pipeline(_session(cfg.spark), cfg, messages=messages)
    start = "where the checkpoint goes on" if report.started_from == "checkpoint" else "the earliest offsets"
    out.print(
        f"{report.messages} messages read from {start}: "
        + (", ".join(f"{topic} {count}" for topic, count in sorted(report.by_topic.items())) or "none")
    )
    missing = [t for t in cfg.kafka.topics or [] if t not in report.by_topic]
    if missing:
        out.print(f"no messages in {', '.join(missing)} (empty, missing, or nothing new since the checkpoint)")
    _print_findings(report)


def _print_findings(report: CheckReport) -> None:
    """What `check` and `replay --dry-run` found in the messages they decoded; exits 1 if one would be a dead letter
    (it does not decode, a setting refuses it, its key is NULL, it lacks its `sequence_by` value, its lake table
    cannot hold one of its values, or its row does not meet a CHECK constraint)."""
    if report.tables:
        tables = Table("source table", "events", "lands", "lake table", "key columns", "new columns")
        for found in report.tables:
            events = ", ".join(f"{op} {count}" for op, count in found.events.items())
            key = f"{', '.join(found.key_columns)} ({found.key_source})" if found.key_columns else "none: whole row"
            key = key if found.lands == "yes" else "-"
            lake_table = (found.lake_table or "-") + ("" if found.in_lake or not found.lake_table else " (new)")
            tables.add_row(found.name, events, found.lands, lake_table, key, ", ".join(found.new_columns) or "-")
        out.print(tables)
        keyless = [f.name for f in report.tables if f.lands == "yes" and not f.key_columns]
        if keyless:
            out.print(
                f"no key columns for {', '.join(keyless)}: their rows are identified by the whole row; if a table "
                "has a primary key, name it under `keys:`"
            )
    for found in report.tables:
        if found.setting_problem:
            refused = found.refused_by_setting
            out.print(f"{refused} events of {found.name} would be dead letters: {found.setting_problem}")
        if found.setting_warning:
            out.print(f"warning: {found.setting_warning}")
        if found.properties_to_set:
            changes = ", ".join(f"{key}={value}" for key, value in sorted(found.properties_to_set.items()))
            out.print(f"lake table {found.lake_table} would get table properties {changes} (table_properties)")
        if found.partitioning_note:
            out.print(f"{found.name}: {found.partitioning_note}")
        if found.untyped_decimals:
            out.print(
                f"{found.name}: {', '.join(found.untyped_decimals)} would land as text: the messages give no precision "
                "and scale; `column_types` (replay: --column-type) types them"
            )
        if found.null_keys and found.lands == "yes":
            out.print(
                f"{found.null_keys} events of {found.name} would be dead letters: a key column "
                f"({', '.join(found.key_columns)}) is NULL in their row, and rows with a NULL key cannot be told apart "
                "(set `keys` for the table to columns that are never NULL)"
            )
        if found.unknown_old_key_warning and found.lands == "yes":
            out.print(f"warning: {found.unknown_old_key_warning}")
        if found.unordered_changes and found.lands == "yes":
            out.print(
                f"{found.unordered_changes} events of {found.name} would be dead letters: {found.unordered_problem}"
            )
        for misfit, count in found.misfits.items():
            out.print(f"{count} events of {found.name} would be dead letters: {misfit}")
        for constraint, count in found.unmet_constraints.items():
            out.print(
                f"{count} events of {found.name} would not meet CHECK constraint {constraint} of lake table "
                f"{found.lake_table} (they would be dead letters)"
            )
    if report.failures:
        failed = Table(*MESSAGE_COLUMNS, "does not decode because")
        for failure in report.failures:
            failed.add_row(*_message_cells(failure.topic, failure.partition, failure.offset), failure.reason)
        out.print(failed)
    if report.failed:
        out.print(f"{report.failed} of {report.messages} messages do not decode (they would be dead letters)")
    if not report.ok:
        raise typer.Exit(1)
    out.print("every message read decodes" if report.messages else "nothing to decode")


# ----------------------------------------------------------------------------------------------------------------
# cdclake dlq

LakeOption = Annotated[str | None, typer.Option(help="Lake directory (or --config).")]
PipelineOption = Annotated[
    str | None, typer.Option("--pipeline", help="Only dead letters recorded by this pipeline (`replay`: file replays).")
]
TopicOption = Annotated[
    str | None, typer.Option("--topic", help="Only this Kafka topic (file replays: the file, as given or absolute).")
]
TableOption = Annotated[str | None, typer.Option("--table", help="Only this source table: table or database.table.")]
ReasonOption = Annotated[
    str | None, typer.Option("--reason", help="Only dead letters whose reason contains this text (any case).")
]
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help="Only dead letters recorded at or after this ISO date or time (UTC unless offset)."),
]


def _dead_letter_filter(
    pipeline: str | None, topic: str | None, table: str | None, reason: str | None, since: str | None
) -> DeadLetterFilter:
    from cdclake.dlq import DeadLetterFilter

    since_time = None
    if since is not None:
        try:
            since_time = datetime.fromisoformat(since)
        except ValueError:
            raise ConfigError(
                "--since",
                f"{since!r} is not an ISO date or date-time",
                "write e.g. --since 2024-03-01 or --since 2024-03-01T10:00:00+08:00",
            ) from None
    return DeadLetterFilter(pipeline=pipeline, topic=topic, table=table, reason=reason, since=since_time)


def _raw_text(raw: bytes | None) -> str:
    """A raw key or value for the terminal: its UTF-8 text, or base64 when it is binary."""
    if raw is None:
        return "-"
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode("ascii")


MESSAGE_COLUMNS: Final = ("topic / file", "partition", "offset / line")
"""Where a message came from, as the dead-letter tables show it (:func:`_message_cells`)."""


def _message_cells(topic: str, partition: int, offset: int) -> list[str]:
    """A message's coordinates for a table: Kafka topic, partition and offset, or for a message of a capture file,
    the file and its line (a file replay's offset codes both; ``sources.files.location``)."""
    from cdclake.sources.files import location

    found = location(topic, offset)
    if found is None:
        return [topic, str(partition), str(offset)]
    path, line = found
    return [path, "-", f"line {line}"]


def _state(dead_letter: DeadLetter) -> str:
    if dead_letter.resolved_at is not None:
        return f"resolved {dead_letter.resolved_at:%Y-%m-%d %H:%M:%S}"
    if dead_letter.failed_replays:
        return f"unresolved ({dead_letter.failed_replays} replays failed)"
    return "unresolved"


@dlq_app.command("list")
def dlq_list(
    lake: LakeOption = None,
    config: Annotated[
        str | None,
        typer.Option("--config", help="A pipeline's configuration (YAML): its lake, and only its dead letters."),
    ] = None,
    pipeline: PipelineOption = None,
    topic: TopicOption = None,
    table: TableOption = None,
    reason: ReasonOption = None,
    since: SinceOption = None,
    include_resolved: Annotated[bool, typer.Option("--all", help="Also list resolved dead letters.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 50,
    show_value: Annotated[bool, typer.Option(help="Also show the raw key and value, and any Kafka headers.")] = False,
) -> None:
    """Dead letters in message order, with the newest reason and whether a replay applied them."""
    from cdclake.dlq import list_dead_letters

    lake, cfg = _lake_of(lake, config)
    filters = _dead_letter_filter(pipeline or (cfg.name if cfg else None), topic, table, reason, since)
    session = _session(cfg.spark if cfg else None)
    listing = list_dead_letters(session, lake, filters, include_resolved=include_resolved, limit=limit)
    if not listing.matched:
        out.print(f"no {'' if include_resolved else 'unresolved '}dead letters match in {lake}")
        return
    columns = [*MESSAGE_COLUMNS, "format", "table", "reason", "recorded at", "state"]
    # Headers only when a shown message has some: most formats' messages never do (Debezium's key updates do).
    show_headers = show_value and any(dead.headers for dead in listing.dead_letters)
    grid = Table(*columns, *(["key", "value"] if show_value else []), *(["headers"] if show_headers else []))
    for dead in listing.dead_letters:
        cells = [
            *_message_cells(dead.topic, dead.partition, dead.offset),
            dead.format or "-",
            ".".join(p for p in (dead.database, dead.table) if p) or "-",
            dead.reason,
            f"{dead.recorded_at:%Y-%m-%d %H:%M:%S}",
            _state(dead),
        ]
        raw = [_raw_text(dead.key), _raw_text(dead.value)] if show_value else []
        headers = ["\n".join(f"{name}: {_raw_text(value)}" for name, value in dead.headers)] if show_headers else []
        grid.add_row(*cells, *raw, *headers)
    out.print(grid)
    shown = "" if listing.matched == len(listing.dead_letters) else f"; first {len(listing.dead_letters)} shown"
    out.print(f"{listing.matched} dead letters, {listing.unresolved} unresolved{shown}")


TableFormatOption = Annotated[
    str, typer.Option(help="The lake tables' format: delta, or iceberg (README: Iceberg lake tables).")
]
DefaultTableFormatOption = Annotated[
    str | None,
    typer.Option(help="The lake tables' format: delta (default), or iceberg (README: Iceberg lake tables)."),
]
"""For the commands that can take it from a pipeline's configuration instead (--config)."""
IcebergCatalogOption = Annotated[
    str | None,
    typer.Option(help="With --table-format iceberg: a Spark catalog of the session for the lake tables."),
]


def _check_table_format(table_format: str, iceberg_catalog: str | None) -> None:
    if table_format not in ("delta", "iceberg"):
        raise InputError(f"--table-format must be 'delta' or 'iceberg', not {table_format!r}")
    if iceberg_catalog is not None and table_format != "iceberg":
        raise InputError("--iceberg-catalog is only used with --table-format iceberg")


def _check_partition_by(partition_by: dict[str, list[str]], table_format: str) -> None:
    from cdclake.sinks.partitioning import check_partition_by

    try:
        check_partition_by(partition_by, table_format)
    except ConfigError as exc:
        table = exc.key.removeprefix("partition_by.")
        raise InputError(f"--partition-by {table}: {exc.problem}; {exc.fix}") from None


@dlq_app.command("replay")
def dlq_replay(
    lake: LakeOption = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="The pipeline's configuration (YAML): replay with its lake, format options, keys, tables, routes, "
            "DDL, sequence_by, history tables, table format and Spark settings, and only its dead letters "
            "(--pipeline defaults to its name).",
        ),
    ] = None,
    format_name: Annotated[
        str | None,
        typer.Option("--format", help="Decode with this format instead of the one that read each dead letter."),
    ] = None,
    keys: Annotated[
        list[str] | None,
        typer.Option(help="Key columns for a table whose messages carry none: db.table=c1,c2 (as the pipeline's)."),
    ] = None,
    option: Annotated[
        list[str] | None, typer.Option("--option", help="A format option, name=value (see `cdclake formats`).")
    ] = None,
    column_type: ColumnTypeOption = None,
    sequence_by: SequenceByOption = None,
    include_table: IncludeTableOption = None,
    exclude_table: ExcludeTableOption = None,
    route: RouteOption = None,
    online_schema_change: OnlineSchemaChangeOption = False,
    pipeline: PipelineOption = None,
    topic: TopicOption = None,
    table: TableOption = None,
    reason: ReasonOption = None,
    since: SinceOption = None,
    dry_run: Annotated[
        bool, typer.Option(help="Only decode and report what would go through and what still fails; write nothing.")
    ] = False,
    table_format: DefaultTableFormatOption = None,
    iceberg_catalog: IcebergCatalogOption = None,
) -> None:
    """Decode unresolved dead letters again and apply them like any batch; each is applied at most once."""
    from cdclake.dlq import replay_dead_letters
    from cdclake.formats import get_format

    key_map = _parse_keys(keys or [])
    column_type_map = _parse_column_types(column_type or [])
    sequence_map = _parse_sequence_by(sequence_by or [])
    options = _parse_options(option or [])
    if format_name is not None:
        get_format(format_name)
    settled = {
        "--include-table": bool(include_table),
        "--exclude-table": bool(exclude_table),
        "--route": bool(route),
        "--online-schema-change": online_schema_change,
        "--table-format": table_format is not None,
        "--iceberg-catalog": iceberg_catalog is not None,
    }
    lake, cfg = _lake_of(lake, config, settled, adding="--keys, --column-type, --sequence-by, --option and the filters")
    settings, spark_conf = None, None
    if cfg is not None:
        from cdclake.runner import settings_from_config

        settings, spark_conf = settings_from_config(cfg, app_id=""), cfg.spark
        pipeline = pipeline or cfg.name
    else:
        _check_table_format(table_format or "delta", iceberg_catalog)
    filters = _dead_letter_filter(pipeline, topic, table, reason, since)
    with out.status("replaying dead letters..."):
        report = replay_dead_letters(
            _session(spark_conf),
            lake,
            format_name=format_name,
            keys=key_map,
            column_types=column_type_map,
            sequence_by=sequence_map,
            format_options=options,
            tables=_table_filter(include_table or [], exclude_table or []) if include_table or exclude_table else None,
            routes=_table_routes(route) if route else None,
            online_schema_change=OnlineSchemaChange() if online_schema_change else None,
            filters=filters,
            dry_run=dry_run,
            table_format=table_format,  # type: ignore[arg-type]
            iceberg_catalog=iceberg_catalog,
            pipeline=settings,
        )
    if not report.selected:
        out.print(f"no unresolved dead letters match in {lake}")
        return
    if report.failures:
        failed = Table(*MESSAGE_COLUMNS, "still failing because")
        for failure in report.failures[:50]:
            failed.add_row(*_message_cells(failure.topic, failure.partition, failure.offset), failure.reason)
        out.print(failed)
        if len(report.failures) > 50:
            out.print(f"... and {len(report.failures) - 50} more (cdclake dlq list --lake {lake})")
    if report.changes:
        changed = Table("lake table", "row changes applied")
        for path in sorted(report.changes):
            changed.add_row(path.removeprefix(lake.rstrip("/") + "/"), str(report.changes[path]))
        out.print(changed)
    formats_used = ", ".join(f"{name}: {count}" for name, count in sorted(report.formats.items()))
    if dry_run:
        out.print(
            f"dry run ({formats_used}): {report.selected} dead letters, {report.applied} would decode, "
            f"{len(report.failures)} still fail to decode; nothing written"
        )
    else:
        out.print(
            f"{report.replay_id} ({formats_used}): {report.selected} dead letters, {report.applied} applied, "
            f"{len(report.failures)} failed again"
        )


@app.command()
def maintain(
    lake: LakeOption = None,
    config: ConfigOption = None,
    retain_hours: Annotated[
        int,
        typer.Option(
            help="Keep what versions of the last N hours need (time travel, readers still at them); remove the rest.",
            min=0,
        ),
    ] = 168,
    table_format: DefaultTableFormatOption = None,
    iceberg_catalog: IcebergCatalogOption = None,
) -> None:
    """Remove old files and snapshots from the lake, history and bookkeeping tables (Delta VACUUM, Iceberg
    expire_snapshots and remove_orphan_files). Run it while no pipeline writes the lake, or keep --retain-hours
    longer than any write takes."""
    from cdclake.maintain import maintain_lake

    settled = {"--table-format": table_format is not None, "--iceberg-catalog": iceberg_catalog is not None}
    lake, cfg = _lake_of(lake, config, settled)
    if cfg is not None:
        table_format, iceberg_catalog = cfg.table_format, cfg.iceberg_catalog
    table_format = table_format or "delta"
    _check_table_format(table_format, iceberg_catalog)
    with out.status("removing old files..."):
        done = maintain_lake(
            _session(cfg.spark if cfg else None),
            lake,
            table_format=table_format,  # type: ignore[arg-type]
            iceberg_catalog=iceberg_catalog,
            retain_hours=retain_hours,
        )
    if not done:
        raise InputError(f"no cdclake tables in {lake} (nothing applied yet, or not a cdclake lake)")
    table = Table("kind", "table", "format", "files removed")
    for item in done:
        table.add_row(item.kind, item.name, item.table_format, str(item.removed_files))
    out.print(table)
    removed = sum(item.removed_files for item in done)
    out.print(f"{len(done)} tables, {removed} files removed (kept what the last {retain_hours} hours need)")


def _session(conf: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    from cdclake.spark import get_session

    return get_session(conf=conf)


def _print_summary(  # type: ignore[no-untyped-def]
    spark, lake: str, results, table_format: str, iceberg_catalog: str | None, *, started: datetime
) -> None:
    """What a file replay applied, per lake table, and the dead letters it recorded (since ``started``)."""
    from cdclake.sinks import lake_sink

    sink = lake_sink(spark, lake, table_format, iceberg_catalog=iceberg_catalog)  # type: ignore[arg-type]
    events = sum(r.messages for r in results)  # decoded events: a Canal message of 3 rows is 3
    dead = sum(r.dead_letters for r in results)
    excluded = sum(r.excluded for r in results)
    changes: dict[str, int] = {}
    for result in results:
        for path, count in result.applied.items():
            changes[path] = changes.get(path, 0) + count
    table = Table("lake table", "row changes applied", "rows now")
    for path in sorted(changes):
        rows = sink.row_count(path)
        table.add_row(path.removeprefix(lake.rstrip("/") + "/"), str(changes[path]), str(rows))
    out.print(table)
    left_out = f", {excluded} events of excluded tables" if excluded else ""
    out.print(f"{events} events, {len(changes)} tables, {dead} dead letters{left_out}")
    if dead:
        _print_replayed_dead_letters(spark, lake, since=started, count=dead)


REPLAY_DEAD_LETTERS_SHOWN: Final = 10


def _print_replayed_dead_letters(spark, lake: str, *, since: datetime, count: int) -> None:  # type: ignore[no-untyped-def]
    """The first dead letters a file replay recorded, each with its file and line, so that a bad capture line can be
    looked at without a second command."""
    from cdclake.dlq import DeadLetterFilter, list_dead_letters

    filters = DeadLetterFilter(pipeline="replay", since=since)
    listing = list_dead_letters(spark, lake, filters, limit=REPLAY_DEAD_LETTERS_SHOWN)
    grid = Table("file", "line", "table", "reason")
    for dead in listing.dead_letters:
        path, _, line = _message_cells(dead.topic, dead.partition, dead.offset)
        table = ".".join(p for p in (dead.database, dead.table) if p) or "-"
        grid.add_row(path, line.removeprefix("line "), table, dead.reason)
    out.print(grid)
    if count > len(listing.dead_letters):
        out.print(
            f"first {len(listing.dead_letters)} of {count} shown: cdclake dlq list --lake {lake} --pipeline replay"
        )


def _one_line_summaries(*apps: typer.Typer) -> None:
    """Each command's line in its group's list is its docstring's first paragraph on one line: typer's rich help
    keeps the docstring's own line breaks there, which cut the list's text mid-sentence."""
    for group in apps:
        for command in group.registered_commands:
            if command.short_help is None and command.callback is not None:
                first_paragraph = (inspect.getdoc(command.callback) or "").split("\n\n")[0]
                command.short_help = " ".join(first_paragraph.split()) or None


_one_line_summaries(app, dlq_app)


def main() -> None:
    """Console entry point: usage errors exit 2 (typer), cdclake errors exit 1 with a one-line message."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except CdclakeError as exc:
        err.print(Text.assemble(("error:", "red"), f" {exc}"))
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
