"""The secret search used by the leak tests finds a planted token wherever it hides.

Proof that it can fail: a token planted inside a payload of a real (golden)
history is invisible to a plain search of the JSON (payloads are base64) but
found here; so are a token in a log record's traceback, in its arguments and
in an extra field, and a token put somewhere base64-encoded.
"""

import base64
import json
import logging
from pathlib import Path

from tests.secret_search import found_in, history_text, log_texts

GOLDEN = Path(__file__).parent.parent / "histories" / "placement-bound-done.json"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.planted-for-the-test.c2lnbmF0dXJl"


def planted_history() -> str:
    history = json.loads(GOLDEN.read_text())
    payload = history["events"][0]["workflowExecutionStartedEventAttributes"]["input"]["payloads"][0]
    request = json.loads(base64.b64decode(payload["data"]))
    request["group"] = f"oops {TOKEN}"
    payload["data"] = base64.b64encode(json.dumps(request).encode()).decode()
    return json.dumps(history)


def test_a_token_inside_a_history_payload_is_found() -> None:
    planted = planted_history()
    assert TOKEN not in planted  # a plain search of the JSON would miss it
    assert found_in(TOKEN, {"planted": history_text(planted)}) == ["planted"]
    assert found_in(TOKEN, {"golden": history_text(GOLDEN.read_text())}) == []


def test_a_token_in_a_log_record_is_found_wherever_it_sits() -> None:
    logger = logging.getLogger("leak-test")
    try:
        raise RuntimeError(f"header X-SLURM-USER-TOKEN: {TOKEN}")
    except RuntimeError as error:
        in_traceback = logger.makeRecord(
            "leak-test", logging.WARNING, __file__, 1, "failed", (), (type(error), error, error.__traceback__)
        )
    in_args = logger.makeRecord("leak-test", logging.INFO, __file__, 1, "token %s", (TOKEN,), None)
    in_extra = logger.makeRecord(
        "leak-test", logging.INFO, __file__, 1, "fine", (), None, extra={"headers": {"t": TOKEN}}
    )
    clean = logger.makeRecord("leak-test", logging.INFO, __file__, 1, "nothing here", (), None)
    texts = log_texts([in_traceback, in_args, in_extra, clean])
    assert found_in(TOKEN, texts) == ["log 0 leak-test", "log 1 leak-test", "log 2 leak-test"]


def test_a_base64_encoded_token_is_found() -> None:
    hidden = base64.b64encode(TOKEN.encode()).decode()
    assert found_in(TOKEN, {"event": f"message {hidden}"}) == ["event"]
