"""The HTTP contract, fuzzed: every operation of the OpenAPI document, with requests schemathesis
generates from it (schema-valid and schema-invalid), against the app in-process. The service
must answer what the document says: documented statuses, content types and bodies; schema-valid
requests accepted, schema-invalid ones refused; never a 5xx.

What it found (issue #31) and what was fixed on either side: ``HEAD`` on entries answered
``application/octet-stream`` where the schema said JSON; identical re-uploads (and repeated pins,
workload manifests, run reports) answered an undocumented 200; ``older_than_s: true`` was taken
as 1 s; ``x-kcache-compile-time: null`` was schema-valid (FastAPI writes ``null`` into an
optional header) and refused; a run report with no body and a GC ``env`` of ``"0"`` were
schema-valid (the body was undocumented, the selector's form too) and refused.

Known exceptions, each for a rule a JSON schema cannot state: a kernel pack is binary whose
validity (zstd, tar, hashes, the key) only the service's verifier can judge, so a generated
pack is refused (``positive_data_acceptance`` is off for that upload); a workload manifest must
name the workload of its URL, so generated manifests are given the path's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from kcache_schemas import wire  # noqa: E402
from kcache_schemas.pack import MEDIA_TYPE  # noqa: E402
from kcache_server.app import create_app  # noqa: E402
from kcache_server.settings import Settings  # noqa: E402
from schemathesis.checks import not_a_server_error, positive_data_acceptance  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

EXAMPLES = 25  # per operation and mode; the whole run stays well under a minute here

_data = Path(__import__("tempfile").mkdtemp(prefix="kcache-schemathesis-"))
app = create_app(Settings(data_dir=_data, access_flush_s=0.2))
# Extra parameters are what HTTP allows (an unknown header is no error): not a schema violation.
config = SchemathesisConfig.from_dict({"generation": {"mode": "all", "max-examples": EXAMPLES, "allow-extra-parameters": False}})
schemathesis.openapi.media_type(MEDIA_TYPE, st.binary(max_size=4096))
schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_service_answers_what_its_openapi_document_says(case: Any) -> None:
    excluded = []
    if (case.method, case.operation.path) == ("PUT", wire.KERNEL):
        excluded.append(positive_data_acceptance)  # a pack's validity is not a schema's to state
    positive = case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE
    if (case.method, case.operation.path) == ("PUT", wire.WORKLOAD) and positive and isinstance(case.body, dict):
        case.body["name"] = case.path_parameters["name"]  # a manifest names the workload of its URL
    case.call_and_validate(excluded_checks=excluded, additional_checks=[not_a_server_error])
