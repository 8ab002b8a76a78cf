"""Search everything users and operators see for a secret (the Slurm JWT).

Places are named texts: workflow histories (their JSON, and every payload
decoded: Temporal keeps payloads base64-encoded, where a plain search cannot
see them), log records (message, arguments, extras and traceback), Kubernetes
objects (Events, pod conditions, everything) and whatever else a test collects.
`found_in` answers where the secret appears; a test asserts it is nowhere.
"""

import base64
import binascii
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from temporalio.client import Client

_FORMATTER = logging.Formatter("%(levelname)s %(name)s %(message)s")


def decoded_payloads(node: Any) -> Iterator[str]:
    """The decoded `data` and `metadata` values of every payload in a history's JSON."""
    if isinstance(node, dict):
        data = node.get("data")
        if isinstance(data, str) and isinstance(node.get("metadata"), dict):
            yield _b64(data)
            for value in node["metadata"].values():
                if isinstance(value, str):
                    yield _b64(value)
        for value in node.values():
            yield from decoded_payloads(value)
    elif isinstance(node, list):
        for value in node:
            yield from decoded_payloads(value)


def _b64(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return text


def history_text(history_json: str) -> str:
    """A history's JSON with every payload decoded next to it."""
    return "\n".join([history_json, *decoded_payloads(json.loads(history_json))])


async def workflow_histories(client: Client) -> dict[str, str]:
    """Every workflow run the Temporal server knows: `history <id> <run>` -> its searchable text."""
    texts = {}
    async for execution in client.list_workflows():
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        history = await handle.fetch_history()
        texts[f"history {execution.id} {execution.run_id}"] = history_text(history.to_json())
    return texts


def record_text(record: logging.LogRecord) -> str:
    """What a log line shows, with its traceback, arguments and extras (a JSON log prints them)."""
    return "\n".join([_FORMATTER.format(record), repr(record.args), repr(vars(record))])


def log_texts(records: list[logging.LogRecord]) -> dict[str, str]:
    return {f"log {i} {record.name}": record_text(record) for i, record in enumerate(records)}


def found_in(secret: str, places: Mapping[str, str]) -> list[str]:
    """The places whose text contains the secret (or its base64 form)."""
    forms = {secret, base64.b64encode(secret.encode()).decode()}
    return [name for name, text in places.items() if any(form in text for form in forms)]
