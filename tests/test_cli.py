"""The command line's own output: errors and tables print text from messages and configurations as it is, and the
command lists show each command's summary whole."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rich.table import Table
from typer.testing import CliRunner

from cdclake.cli import main as cli


def test_an_error_keeps_the_brackets_of_what_the_user_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rich reads ``[a-z]`` as a style tag and drops it: the error named a pattern the user never wrote."""
    capture = tmp_path / "messages.jsonl"
    capture.write_text("{}\n", encoding="utf-8")
    argv = ["cdclake", "replay", str(capture), "--lake", str(tmp_path / "lake"), "--keys", "shop.[a-z]*"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 1
    assert " ".join(capsys.readouterr().err.split()) == (
        "error: --keys 'shop.[a-z]*': expected db.table=col1,col2 (the table may be a pattern)"
    )


def test_table_cells_show_names_and_reasons_as_they_are() -> None:
    table = Table("lake table", "reason")
    table.add_row("dbo/[orders]", "column [b] :x: does not fit")
    with cli.out.capture() as captured:
        cli.out.print(table)
    assert "dbo/[orders]" in captured.get()
    assert "column [b] :x: does not fit" in captured.get()


def test_each_command_is_listed_with_its_whole_summary_on_one_line() -> None:
    listed = CliRunner().invoke(cli.app, ["--help"], env={"COLUMNS": "400"}, terminal_width=400).output
    line = next(line for line in listed.splitlines() if " check " in line)
    assert "Try a configuration on the messages the pipeline would read next: Kafka access, decoding, the tables " in (
        line
    )
    assert "its row does not meet a CHECK constraint of its lake table)." in line
    replay = CliRunner().invoke(cli.app, ["dlq", "--help"], env={"COLUMNS": "400"}, terminal_width=400).output
    assert any(
        "Decode unresolved dead letters again and apply them like any batch; each is applied at" in line
        and line.rstrip(" │").endswith("most once.")
        for line in replay.splitlines()
    )


def test_replay_refuses_an_option_its_format_does_not_read_before_starting_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "messages.jsonl"
    capture.write_text("{}\n", encoding="utf-8")
    argv = ["cdclake", "replay", str(capture), "--format", "canal-json", "--lake", str(tmp_path / "lake")]
    monkeypatch.setattr(sys, "argv", [*argv, "--option", "source_timezon=+08:00"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 1
    assert " ".join(capsys.readouterr().err.split()) == (
        "error: config error at '--option': canal-json has no option source_timezon. Fix: remove it, or use one of "
        "its options: source_timezone (`cdclake formats` says what each does)"
    )
    assert not (tmp_path / "lake").exists()
