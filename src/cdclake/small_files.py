"""Small files beside the tables: a query checkpoint's (the idempotent-writer id, the offset log) and the lake's own
settings (:data:`cdclake.pipeline.KAFKA_ORDER_FILE`), read and written through Hadoop's FileSystem, so any URI Spark
can write works."""

from __future__ import annotations

import uuid
from typing import Any

from pyspark.sql import SparkSession


class SmallFiles:
    """Reads and writes small files under a directory (a query checkpoint, a lake) through Hadoop's FileSystem (local,
    HDFS, S3...)."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm
        self.root = root.rstrip("/")
        root_path = jvm.org.apache.hadoop.fs.Path(self.root)
        self._fs = root_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def _path(self, relative: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(f"{self.root}/{relative}")

    def exists(self, relative: str) -> bool:
        return bool(self._fs.exists(self._path(relative)))

    def read(self, relative: str) -> str:
        stream = self._fs.open(self._path(relative))
        try:
            scanner = self._jvm.java.util.Scanner(stream, "UTF-8").useDelimiter("\\A")
            return str(scanner.next()) if scanner.hasNext() else ""
        finally:
            stream.close()

    def write(self, relative: str, text: str) -> None:
        """Writes atomically: a temporary file renamed into place, so a crash never leaves half a file."""
        folder, _, name = relative.rpartition("/")
        temporary = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp" if folder else f".{name}.{uuid.uuid4().hex}.tmp"
        out = self._fs.create(self._path(temporary), True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        if not self._fs.rename(self._path(temporary), self._path(relative)):
            self._fs.delete(self._path(temporary), False)
            raise RuntimeError(f"could not write {self.root}/{relative} (it exists already?)")

    def batch_ids(self, folder: str) -> list[int]:
        if not self.exists(folder):
            return []
        names = [str(status.getPath().getName()) for status in self._fs.listStatus(self._path(folder))]
        return sorted(int(name) for name in names if name.isdigit())
