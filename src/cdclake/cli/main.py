"""``cdclake run | replay | formats``.

Exit codes: 0 success; 1 a cdclake error (bad config, unreadable input, missing jars), with its message on
stderr; 2 bad command-line usage.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cdclake.exceptions import CdclakeError, InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Land CDC streams from Kafka in Delta Lake.")
out = Console()
err = Console(stderr=True)


def _parse_keys(values: list[str]) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for value in values:
        table, sep, columns = value.partition("=")
        names = [c.strip() for c in columns.split(",") if c.strip()]
        if not sep or not table.strip() or not names:
            raise InputError(f"--keys {value!r}: expected db.table=col1,col2")
        keys[table.strip()] = names
    return keys


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
    files: Annotated[list[str], typer.Argument(help="Capture files, applied in this order.")],
    format_name: Annotated[
        str, typer.Option("--format", help="Format name (see `cdclake formats`), or `auto` for JSON formats.")
    ],
    lake: Annotated[str, typer.Option(help="Lake directory.")],
    input_encoding: Annotated[
        str, typer.Option(help="lines: one JSON message per line; b64: one base64 binary message per line.")
    ] = "lines",
    keys: Annotated[
        list[str] | None,
        typer.Option(help="Key columns for a table whose messages carry none: db.table=c1,c2"),
    ] = None,
    batch_lines: Annotated[int, typer.Option(min=1, help="Messages per batch.")] = 1_000_000,
    transaction_consistent: Annotated[
        bool,
        typer.Option(
            "--transaction-consistent",
            help="Apply only complete source transactions (formats that mark them); hold open ones back.",
        ),
    ] = False,
) -> None:
    """Apply captured messages from files, in file order, through the same decode and apply path as `run`."""
    if input_encoding not in ("lines", "b64"):
        raise InputError(f"--input-encoding must be 'lines' or 'b64', not {input_encoding!r}")
    from cdclake.formats import get_format
    from cdclake.runner import replay as run_replay
    from cdclake.sources.files import check_files

    key_map = _parse_keys(keys or [])
    if format_name != "auto":
        get_format(format_name)
    check_files(files)
    if format_name == "auto":
        from cdclake.detect import detect_format, sample_lines

        format_name = detect_format(sample_lines(files, input_encoding))
        err.print(f"--format auto: detected {format_name}")
    spark = _session()
    with out.status("replaying...") as status:
        results = run_replay(
            spark,
            lake=lake,
            format_name=format_name,
            paths=files,
            encoding=input_encoding,  # type: ignore[arg-type]
            keys=key_map,
            batch_lines=batch_lines,
            transaction_consistent=transaction_consistent,
            on_batch=lambda r: status.update(f"batch {r.batch_id}: {r.messages} messages"),
        )
    _print_summary(spark, lake, results)


@app.command()
def status(lake: Annotated[str, typer.Option(help="Lake directory.")]) -> None:
    """Per table: last position, last source event time and lag; per Kafka partition: last offset."""
    from cdclake.status import lake_status

    rows = lake_status(_session(), lake)
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
    err.print(f"[bold]{cfg.name}[/]: kafka {cfg.kafka.redacted_options()} -> {cfg.lake}")
    spark = _session(cfg.spark)

    def report(result: object) -> None:
        from cdclake.pipeline import BatchResult

        assert isinstance(result, BatchResult)
        applied = sum(result.applied.values())
        err.print(
            f"batch {result.batch_id}: {result.messages} messages, {applied} row changes applied to "
            f"{len(result.applied)} tables, {result.dead_letters} dead letters"
        )

    run_stream(spark, cfg, until_caught_up=until_caught_up, on_batch=report)


def _session(conf: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    from cdclake.spark import get_session

    return get_session(conf=conf)


def _print_summary(spark, lake: str, results) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    messages = sum(r.messages for r in results)
    dead = sum(r.dead_letters for r in results)
    changes: dict[str, int] = {}
    for result in results:
        for path, count in result.applied.items():
            changes[path] = changes.get(path, 0) + count
    table = Table("lake table", "row changes applied", "rows now")
    for path in sorted(changes):
        rows = DeltaTable.forPath(spark, path).toDF().count()
        table.add_row(path.removeprefix(lake.rstrip("/") + "/"), str(changes[path]), str(rows))
    out.print(table)
    out.print(f"{messages} messages, {len(changes)} tables, {dead} dead letters")


def main() -> None:
    """Console entry point: usage errors exit 2 (typer), cdclake errors exit 1 with a one-line message."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except CdclakeError as exc:
        err.print(f"[red]error:[/] {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
