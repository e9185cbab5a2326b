"""Transaction-consistent mode: a batch applies only complete source transactions; open ones wait for their end.

The reference is independent of the pipeline: the source truth (``SourceHistory.truth``) of the changes whose
transaction is complete in the messages sent so far, read from the messages' descriptions (TRANSACTION_BEGIN /
TRANSACTION_END around the changes of each transaction, DDL and TRUNCATE alone), compared with an independent
Delta reader (delta-rs).
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from cdclake.config import parse_config
from cdclake.devtools.verify import compare_lake, describe, read_table
from cdclake.exceptions import ConfigError
from cdclake.pipeline import PENDING_TRANSACTIONS, Pipeline, PipelineSettings
from cdclake.spark import local_frame
from cdclake.workload import DataWorksOptions, HistoryConfig, Message, SourceHistory, render, to_jsonl
from cdclake.workload.dataworks import dumps, heartbeat

TOPIC = "dw.all"
MESSAGE_SCHEMA = "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
CHANGE_MESSAGES = frozenset({"INSERT", "DELETE", "UPDATE_AFTER", "TRUNCATE", "ALTER"})
"""Descriptions of the message that completes one change (a split update's UPDATE_BEFOR does not)."""


def _history(seed: int, events: int) -> SourceHistory:
    return SourceHistory.generate(
        HistoryConfig(
            seed=seed, tables=3, events=events, keys_per_table=20, keyless_tables=1, truncates=1, added_columns=1
        )
    )


def _messages(history: SourceHistory, seed: int, **options: Any) -> list[Message]:
    shape = {"update_mode": "mixed", "heartbeat_every": 25, "failover_resends": 1, "malformed": 2, "transactions": True}
    return render(history, DataWorksOptions(**{**shape, **options}), seed=seed)  # type: ignore[arg-type]


def _committed_changes(messages: list[Message], *, complete_transactions: bool) -> int:
    """How many changes of the history (in commit order) the messages commit: with ``complete_transactions``
    only those of transactions whose TRANSACTION_END is among them, else every change seen. Re-sent copies
    and malformed messages add nothing new."""
    committed = in_open_transaction = 0
    inside = False
    for message in messages:
        if message.is_resend or message.is_malformed:
            continue
        kind = message.description.split(" ")[0]
        if kind == "TRANSACTION_BEGIN":
            inside, in_open_transaction = True, 0
        elif kind == "TRANSACTION_END":
            committed += in_open_transaction
            inside, in_open_transaction = False, 0
        elif kind in CHANGE_MESSAGES:
            if inside and complete_transactions:
                in_open_transaction += 1
            else:
                committed += 1
    return committed


def _open_tail(messages: list[Message]) -> list[int]:
    """Indexes of the messages from the last TRANSACTION_BEGIN on, when no TRANSACTION_END follows it (re-sent
    copies included: they are transactions too)."""
    begins = [i for i, m in enumerate(messages) if m.description.endswith("TRANSACTION_BEGIN")]
    if not begins or any(m.description.endswith("TRANSACTION_END") for m in messages[begins[-1] :]):
        return []
    return list(range(begins[-1], len(messages)))


def _truth_after(history: SourceHistory, changes: int) -> dict[tuple[str, str], list[dict[str, Any]]]:
    return SourceHistory(history.tables, history.changes[:changes]).truth()


def _assert_lake_equals(lake: str, truth: dict[tuple[str, str], list[dict[str, Any]]], context: str) -> None:
    results = compare_lake(lake, truth)
    assert all(r.ok for r in results), f"{context}\n{describe(results)}"


def _frame(spark, messages: list[Message], first_offset: int, topic: str = TOPIC, partition: int = 0):  # type: ignore[no-untyped-def]
    rows = [(m.key, m.value, topic, partition, first_offset + i, None) for i, m in enumerate(messages)]
    return local_frame(spark, rows, MESSAGE_SCHEMA)


def _pipeline(spark, lake: str, **settings: Any) -> Pipeline:  # type: ignore[no-untyped-def]
    return Pipeline(
        spark,
        PipelineSettings(
            lake=lake, app_id=f"test-{uuid.uuid4()}", default_format="dataworks-json", name="txn-test", **settings
        ),
    )


def _batches(messages: list[Message], size: int) -> list[tuple[int, list[Message]]]:
    """(first offset, messages) of consecutive batches of ``size`` messages."""
    return [(start, messages[start : start + size]) for start in range(0, len(messages), size)]


def _held(spark, lake: str) -> list[int]:  # type: ignore[no-untyped-def]
    """Offsets of the messages in the newest stored generation of held messages."""
    path = Path(lake) / "_cdclake" / PENDING_TRANSACTIONS
    if not path.exists():
        return []
    pending = spark.read.format("delta").load(str(path))
    newest = pending.agg({"generation": "max"}).first()[0]
    rows = pending.where(f"generation = {newest} AND NOT generation_header").select("offset").collect()
    return sorted(row["offset"] for row in rows)


def _versions(lake: str) -> dict[str, int]:
    """Delta version of every table in the lake (user and bookkeeping tables)."""
    from deltalake import DeltaTable

    return {str(log.parent): DeltaTable(str(log.parent)).version() for log in Path(lake).rglob("_delta_log")}


@pytest.mark.spark
def test_batches_apply_only_complete_transactions(spark, lake: str) -> None:
    history = _history(seed=31, events=60)
    messages = _messages(history, seed=31)
    pipeline = _pipeline(spark, lake, transaction_consistent=True)
    cut_inside_a_transaction = 0
    for batch_id, (start, batch) in enumerate(_batches(messages, 29)):
        pipeline.process_batch(_frame(spark, batch, start), batch_id)
        sent = messages[: start + len(batch)]
        complete = _committed_changes(sent, complete_transactions=True)
        cut_inside_a_transaction += complete < _committed_changes(sent, complete_transactions=False)
        _assert_lake_equals(lake, _truth_after(history, complete), f"after batch {batch_id}")
        assert _held(spark, lake) == _open_tail(sent)  # offsets are the indexes
    assert cut_inside_a_transaction >= 3  # the batches really did split transactions
    _assert_lake_equals(lake, history.truth(), "at the end")
    assert pipeline.pending_transaction_messages() == 0


@pytest.mark.spark
def test_mode_off_applies_every_change_seen(spark, lake: str) -> None:
    history = _history(seed=32, events=40)
    # Merged updates: with split ones a batch may end between the halves, and the row is briefly absent.
    messages = _messages(history, seed=32, update_mode="merged")
    pipeline = _pipeline(spark, lake)
    partial = 0
    for batch_id, (start, batch) in enumerate(_batches(messages, 23)):
        pipeline.process_batch(_frame(spark, batch, start), batch_id)
        sent = messages[: start + len(batch)]
        seen = _committed_changes(sent, complete_transactions=False)
        partial += seen > _committed_changes(sent, complete_transactions=True)
        _assert_lake_equals(lake, _truth_after(history, seen), f"after batch {batch_id}")
    assert partial >= 2  # some batches ended inside a transaction, and their part of it was applied
    assert not (Path(lake) / "_cdclake" / PENDING_TRANSACTIONS).exists()
    _assert_lake_equals(lake, history.truth(), "at the end")


@pytest.mark.spark
def test_a_rerun_batch_changes_nothing_and_a_crash_before_storing_held_messages_recovers(
    spark, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = _history(seed=33, events=40)
    messages = _messages(history, seed=33)
    pipeline = _pipeline(spark, lake, transaction_consistent=True)
    batches = _batches(messages, 19)
    # The first batch after batch 0 that ends inside a transaction, so that it has held messages to store.
    crash_at = next(b for b, (start, batch) in enumerate(batches) if b and _open_tail(messages[: start + len(batch)]))
    for batch_id, (start, batch) in enumerate(batches):
        frame = _frame(spark, batch, start)
        if batch_id == crash_at:
            # The batch's tables are written, then the process dies before the held messages are stored.
            def crash(*args: object, **kwargs: object) -> None:
                raise RuntimeError("killed before storing the held messages")

            with monkeypatch.context() as patch:
                patch.setattr(pipeline.sink, "replace_partition", crash)
                with pytest.raises(RuntimeError, match="killed"):
                    pipeline.process_batch(frame, batch_id)
        pipeline.process_batch(frame, batch_id)
        if batch_id in (1, 3):
            versions, held = _versions(lake), _held(spark, lake)
            tables = {path: sorted(map(repr, read_table(path))) for path in versions}
            result = pipeline.process_batch(frame, batch_id)  # the same batch again, as after a crash
            assert _versions(lake) == versions  # not one commit
            assert {path: sorted(map(repr, read_table(path))) for path in versions} == tables
            assert _held(spark, lake) == held
            assert result.messages > 0  # it did decode and split the batch again
        complete = _committed_changes(messages[: start + len(batch)], complete_transactions=True)
        _assert_lake_equals(lake, _truth_after(history, complete), f"after batch {batch_id}")
    _assert_lake_equals(lake, history.truth(), "at the end")


def _without_last_end(messages: list[Message]) -> list[Message]:
    last_end = max(i for i, m in enumerate(messages) if m.description == "TRANSACTION_END")
    return messages[:last_end] + messages[last_end + 1 :]


@pytest.mark.spark
@pytest.mark.parametrize("limit", ["seconds", "messages"])
def test_a_transaction_whose_end_never_arrives_is_applied_after_the_limit(
    spark, lake: str, limit: str, caplog: pytest.LogCaptureFixture
) -> None:
    history = _history(seed=34, events=60)
    messages = _without_last_end(_messages(history, seed=34, failover_resends=0, malformed=0, heartbeat_every=0))
    pipeline = _pipeline(
        spark, lake, transaction_consistent=True, transaction_max_open_seconds=600, transaction_max_pending_messages=30
    )
    pipeline.process_batch(_frame(spark, messages, 0), 0)
    without_last = _committed_changes(messages, complete_transactions=True)
    assert without_last < len(history.changes)
    _assert_lake_equals(lake, _truth_after(history, without_last), "END missing: the transaction waits")
    assert _held(spark, lake)

    newest_ms = history.changes[-1].event_time_ms
    if limit == "seconds":  # the source moves on: a heartbeat 11 minutes later
        later = [Message(None, dumps(heartbeat(newest_ms + 660_000)), "heartbeat")]
    else:  # 30 more messages (heartbeats within the time limit) after the open BEGIN of that partition
        later = [Message(None, dumps(heartbeat(newest_ms + i)), "heartbeat") for i in range(30)]
    with caplog.at_level(logging.WARNING, logger="cdclake.pipeline"):
        pipeline.process_batch(_frame(spark, later, len(messages)), 1)
    _assert_lake_equals(lake, history.truth(), "after the limit")
    assert _held(spark, lake) == []
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "without its end marker" in warning
    assert f"from {TOPIC}[0] offset" in warning
    assert "limit 600" in warning


@pytest.mark.spark
def test_cli_replay_transaction_consistent_leaves_the_unfinished_transaction_pending(
    spark, lake: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from typer.testing import CliRunner

    from cdclake.cli.main import app

    history = _history(seed=35, events=40)
    messages = _messages(history, seed=35, failover_resends=0, malformed=0)
    # The capture ends right after the first change of a transaction in the second half of the stream.
    begin = next(
        i
        for i, m in enumerate(messages)
        if i > len(messages) // 2
        and m.description == "TRANSACTION_BEGIN"
        and messages[i + 1].description.split(" ")[0] in CHANGE_MESSAGES
    )
    captured = messages[: begin + 2]
    path = tmp_path / "dw.jsonl"
    path.write_text(to_jsonl(captured), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="cdclake.runner"):
        done = CliRunner().invoke(
            app, ["replay", "--format", "dataworks-json", "--lake", lake, "--transaction-consistent", str(path)]
        )
    assert done.exit_code == 0, done.output
    complete = _committed_changes(captured, complete_transactions=True)
    assert complete < _committed_changes(captured, complete_transactions=False)
    _assert_lake_equals(lake, _truth_after(history, complete), "replay ending inside a transaction")
    assert "2 messages of source transactions without their end marker are held back" in caplog.text
    assert _held(spark, lake) == [begin, begin + 1]


def _maxwell(row_id: int, xid: int | None, *, commit: bool = False, kind: str = "insert") -> Message:
    value: dict[str, Any] = {
        "database": "shop",
        "table": "tag",
        "type": kind,
        "ts": 1709288131 + row_id,
        "primary_key_columns": ["id"],
        "data": {"id": row_id, "label": f"label {row_id}"},
    }
    if xid is not None:
        value["xid"] = xid
    if commit:
        value["commit"] = True
    return Message(None, json.dumps(value).encode(), f"{kind} {row_id}")


@pytest.mark.spark
def test_transaction_ids_group_events_across_partitions_until_their_end(spark, lake: str) -> None:
    """Maxwell: every row carries its transaction's xid, the last row ``commit: true``; rows of one transaction
    may sit in several partitions (Maxwell partitions by database by default)."""
    pipeline = Pipeline(
        spark,
        PipelineSettings(
            lake=lake, app_id=f"test-{uuid.uuid4()}", default_format="maxwell-json", transaction_consistent=True
        ),
    )

    def ids() -> list[int]:
        return sorted(row["id"] for row in read_table(f"{lake}/shop/tag"))

    first = _frame(spark, [_maxwell(1, 700), _maxwell(2, 700)], 0, "maxwell", 0).unionByName(
        _frame(spark, [_maxwell(10, 800, commit=True), _maxwell(20, None, kind="bootstrap-insert")], 0, "maxwell", 1)
    )
    pipeline.process_batch(first, 0)
    assert ids() == [10, 20]  # transaction 800 is complete; a row without a transaction id is never held
    pipeline.process_batch(_frame(spark, [_maxwell(30, 900)], 2, "maxwell", 0), 1)
    assert ids() == [10, 20]  # 700 and 900 are still open
    pipeline.process_batch(_frame(spark, [_maxwell(3, 700, commit=True)], 2, "maxwell", 1), 2)
    assert ids() == [1, 2, 3, 10, 20]  # 700 ended in the other partition; 900 still waits
    assert pipeline.pending_transaction_messages() == 1


def test_config_transactions_section() -> None:
    base = {"lake": "/l", "kafka": {"bootstrap_servers": "b:9092", "topics": ["t"]}, "format": "dataworks-json"}
    assert parse_config(base).transactions.consistent is False
    config = parse_config({**base, "transactions": {"consistent": True, "max_open_seconds": 30}})
    assert (config.transactions.consistent, config.transactions.max_open_seconds) == (True, 30)
    assert config.transactions.max_pending_messages == 100_000
    with pytest.raises(ConfigError) as info:
        parse_config({**base, "transactions": {"consistent": True, "max_pending_messages": 0}})
    assert info.value.key == "transactions.max_pending_messages"
    assert "transactions: {consistent: true}" in info.value.fix


@pytest.mark.spark
def test_held_messages_keep_their_headers(spark, lake: str) -> None:
    """A Debezium primary-key update inside an open transaction is held, and decoded again when its END comes:
    from the stored held messages, whose headers must come back with them. The ``c`` (Oracle: no pairing by
    position) then still moves the old key's row by its ``__debezium.oldkey`` header, keeping the column it lacks,
    and the ``d`` (``__debezium.newkey``) is not applied (debezium.md 2)."""
    topic = "dbz.notes"

    def transaction(status: str, txn: str, count: int = 0) -> tuple[None, bytes]:
        marker: dict[str, Any] = {"status": status, "id": txn, "ts_ms": 1}
        if status == "END":
            marker |= {
                "event_count": count,
                "data_collections": [{"data_collection": "APP.NOTES", "event_count": count}],
            }
        return None, json.dumps(marker).encode()

    def change(op: str, scn: int, txn: str, image: dict[str, Any]) -> tuple[bytes, bytes]:
        source = {"connector": "oracle", "db": "APPDB", "schema": "APP", "table": "NOTES", "scn": scn, "ts_ms": 1}
        images = {"before": image, "after": None} if op == "d" else {"before": None, "after": image}
        value = {**images, "source": source, "op": op, "ts_ms": 1, "transaction": {"id": txn, "total_order": 1}}
        return json.dumps({"ID": image["ID"]}).encode(), json.dumps(value).encode()

    def frame(messages: list[tuple[Any, ...]], first_offset: int):  # type: ignore[no-untyped-def]
        rows = [(k, v, topic, 0, first_offset + i, None, h) for i, (k, v, h) in enumerate(messages)]
        return local_frame(spark, rows, f"{MESSAGE_SCHEMA}, headers array<struct<key: string, value: binary>>")

    def rows() -> list[tuple[Any, ...]]:
        return sorted((row["ID"], row["TITLE"], row["BODY"]) for row in read_table(f"{lake}/APPDB/NOTES"))

    pipeline = Pipeline(
        spark,
        PipelineSettings(
            lake=lake, app_id=f"test-{uuid.uuid4()}", default_format="debezium-json", transaction_consistent=True
        ),
    )
    first = [
        (*transaction("BEGIN", "t0"), None),
        (*change("c", 100, "t0", {"ID": 1, "TITLE": "one", "BODY": "text 1"}), None),
        (*transaction("END", "t0", 1), None),
    ]
    pipeline.process_batch(frame(first, 0), 0)
    second = [
        (*transaction("BEGIN", "t1"), None),
        (*change("d", 200, "t1", {"ID": 1, "TITLE": None, "BODY": None}), [("__debezium.newkey", b'{"ID":2}')]),
        (
            *change("c", 200, "t1", {"ID": 2, "TITLE": "two", "BODY": "__debezium_unavailable_value"}),
            [("__debezium.oldkey", b'{"ID":1}')],
        ),
    ]
    pipeline.process_batch(frame(second, 3), 1)
    assert (_held(spark, lake), rows()) == ([3, 4, 5], [(1, "one", "text 1")])
    pipeline.process_batch(frame([(*transaction("END", "t1", 2), None)], 6), 2)
    assert (_held(spark, lake), rows()) == ([], [(2, "two", "text 1")])
