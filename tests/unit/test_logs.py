import json
import logging

import pytest

from worker.logs import JsonFormatter


def test_json_lines_carry_extra_fields_such_as_pod_and_job_id(caplog: pytest.LogCaptureFixture) -> None:
    record = logging.LogRecord("activities.slurm", logging.INFO, __file__, 1, "submitted %s", (7,), None)
    record.job_id = 7
    record.pods = ["ns/p"]
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "submitted 7"
    assert line["level"] == "info"
    assert line["job_id"] == 7
    assert line["pods"] == ["ns/p"]
    assert "T" in line["time"]
