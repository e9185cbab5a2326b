"""Avro schemas by id, for values in Confluent's wire format: a schema registry, or a folder of schema files.

Confluent framing (``shared/formats/debezium.md`` 1): byte 0 is ``0x00``, bytes 1-4 the schema id (big-endian), the
rest the Avro binary written with that schema. The id is the registry's (``GET /schemas/ids/{id}`` of the Confluent
Schema Registry REST API, which Apicurio's and Karapace's compatibility APIs serve too). Ids are global and never
reused, so a schema found once is kept for the life of the process.

This runs on the driver, once per id a batch names that is not known yet: never per message.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cdclake.exceptions import SourceUnavailableError

ACCEPT: Final = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json, application/json"
ATTEMPTS: Final = 3
"""Tries per registry address for a transient failure (connection refused, timeout, HTTP 5xx) before the batch
fails: a registry that is down must stop the stream (it restarts from its checkpoint), not dead-letter every
message."""
TIMEOUT_SECONDS: Final = 10.0


@dataclass(frozen=True)
class RegisteredSchema:
    """What one schema id resolved to: the Avro schema's JSON text, or why there is none (the messages that name
    the id become dead letters with that reason)."""

    schema_id: int
    avro: str | None
    problem: str | None = None


@dataclass(frozen=True)
class SchemaSource:
    """Where schemas are looked up: the ones given inline first, then a folder of files (``<id>.avsc`` or
    ``<id>.json``), then the registry addresses in turn (a registry answering 404 for an id does not have it; the
    next address is asked)."""

    folder: Path | None = None
    urls: tuple[str, ...] = ()
    user_info: str | None = None
    """``user:password`` for HTTP basic authentication (Confluent's ``basic.auth.user.info``)."""
    inline: tuple[tuple[int, str], ...] = ()
    """(schema id, Avro schema JSON text) pairs given in the configuration (option ``schemas``)."""

    def describe(self) -> str:
        where = (["schemas"] if self.inline else []) + (["schemas_dir"] if self.folder else [])
        return " nor in ".join([*where, *(f"the registry at {url}" for url in self.urls)]) or "nowhere"


_cache: dict[tuple[SchemaSource, int], RegisteredSchema] = {}
_lock = threading.Lock()


def resolve(source: SchemaSource, schema_ids: Sequence[int]) -> tuple[RegisteredSchema, ...]:
    """Each id's schema (in the order given). Found schemas are cached; a missing one is asked again next time (a
    registry being restored may have it later). Raises :class:`SourceUnavailableError` when a registry cannot be
    reached."""
    resolved = []
    for schema_id in schema_ids:
        with _lock:
            known = _cache.get((source, schema_id))
        if known is None:
            known = _lookup(source, schema_id)
            if known.avro is not None:
                with _lock:
                    _cache[(source, schema_id)] = known
        resolved.append(known)
    return tuple(resolved)


def _lookup(source: SchemaSource, schema_id: int) -> RegisteredSchema:
    for inline_id, text in source.inline:
        if inline_id == schema_id:
            return _from_document(schema_id, text, "option schemas")
    if source.folder is not None:
        for suffix in (".avsc", ".json"):
            path = source.folder / f"{schema_id}{suffix}"
            if path.is_file():
                return _from_document(schema_id, path.read_text(encoding="utf-8"), str(path))
    for url in source.urls:
        document = _get(url, schema_id, source.user_info)
        if document is not None:
            return _from_document(schema_id, document, url)
    return RegisteredSchema(schema_id, None, f"not found in {source.describe()}")


def _from_document(schema_id: int, text: str, where: str) -> RegisteredSchema:
    """A registry answer (``{"schema": "<text>", "schemaType": ..., "references": [...]}``) or a bare Avro schema."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return RegisteredSchema(schema_id, None, f"{where} is not JSON: {exc}")
    if isinstance(document, dict) and isinstance(document.get("schema"), str):
        schema_type = document.get("schemaType") or "AVRO"
        if schema_type != "AVRO":
            return RegisteredSchema(schema_id, None, f"is a {schema_type} schema, not Avro")
        if document.get("references"):
            return RegisteredSchema(schema_id, None, "refers to other schemas (schema references are not resolved)")
        return RegisteredSchema(schema_id, document["schema"])
    return RegisteredSchema(schema_id, json.dumps(document))


def _get(url: str, schema_id: int, user_info: str | None) -> str | None:
    """The registry's answer for ``schema_id`` at ``url``; None when it does not have the id (HTTP 404)."""
    address = f"{url.rstrip('/')}/schemas/ids/{schema_id}"
    headers = {"Accept": ACCEPT}
    if user_info:
        headers["Authorization"] = "Basic " + base64.b64encode(user_info.encode("utf-8")).decode("ascii")
    request = urllib.request.Request(address, headers=headers)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
                return str(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code < 500 or attempt == ATTEMPTS:
                raise SourceUnavailableError(
                    f"schema registry {url} answered HTTP {exc.code} for schema id {schema_id}: {_reason(exc)} "
                    "(check schema_registry_url and schema_registry_user_info)"
                ) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            if attempt == ATTEMPTS:
                raise SourceUnavailableError(
                    f"schema registry {url} cannot be reached for schema id {schema_id}: {exc}"
                ) from exc
        time.sleep(0.5 * 2**attempt)
    return None  # not reached: the last attempt returns or raises


def _reason(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read().decode("utf-8"))
    except (ValueError, OSError):
        return str(error.reason)
    return str(body.get("message", error.reason)) if isinstance(body, dict) else str(error.reason)


def source_from_options(options: Mapping[str, str]) -> SchemaSource:
    """The :class:`SchemaSource` that the options ``schemas`` (a JSON object: schema id -> Avro schema, as an object
    or as text), ``schemas_dir``, ``schema_registry_url`` (comma-separated addresses) and
    ``schema_registry_user_info`` name. Raises ``ValueError`` for a ``schemas`` value that is not such an object."""
    folder = options.get("schemas_dir")
    urls = tuple(u.strip() for u in options.get("schema_registry_url", "").split(",") if u.strip())
    user_info = options.get("schema_registry_user_info") or None
    return SchemaSource(Path(folder) if folder else None, urls, user_info, _inline(options.get("schemas")))


def _inline(text: str | None) -> tuple[tuple[int, str], ...]:
    if not text:
        return ()
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"schemas is not JSON: {exc}") from None
    if not isinstance(given, dict) or not all(str(k).isdigit() for k in given):
        raise ValueError('schemas must be a JSON object of schema ids: {"1": {<Avro schema>}, ...}')
    return tuple(sorted((int(k), v if isinstance(v, str) else json.dumps(v, sort_keys=True)) for k, v in given.items()))


def check_options(options: Mapping[str, str]) -> None:
    """Raises ``ValueError`` naming the option and the fix when the options name no usable schema source."""
    source = source_from_options(options)
    if source.folder is None and not source.urls and not source.inline:
        raise ValueError(
            "set schema_registry_url (the Confluent-compatible registry the producer used, e.g. "
            "http://registry:8081), schemas_dir (a folder of <id>.avsc files) or schemas (a JSON object of them)"
        )
    if source.folder is not None and not source.folder.is_dir():
        raise ValueError(f"schemas_dir {source.folder} is not a folder")
    for url in source.urls:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"schema_registry_url {url!r} is not an http(s) address such as http://registry:8081")
    if source.user_info is not None and ":" not in source.user_info:
        raise ValueError("schema_registry_user_info must be user:password")


def clear_cache() -> None:
    """Forgets every schema found (tests)."""
    with _lock:
        _cache.clear()
