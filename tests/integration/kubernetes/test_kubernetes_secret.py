"""The Kubernetes API Secret adapter, driven through the unmodified official client.

The API server is tests/support/fake_kube_api.py on loopback, serving the requests the client makes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path

import pytest
from kubernetes import client

from pyrigaud.adapters.credentials.kubernetes_secret import (
    KubernetesSecretCredentials,
    SecretReference,
    parse_secret_reference,
)

from support.fake_kube_api import FakeKubeApi

NAMESPACE = "virtrigaud"
NAME = "vsphere-creds"
SECRET_PATH = f"/api/v1/namespaces/{NAMESPACE}/secrets/{NAME}"
_PATIENCE_S = 15.0


def eventually(condition: Callable[[], bool]) -> None:
    """Wait (bounded, generously for a loaded machine) for the watcher to catch up."""
    deadline = time.monotonic() + _PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    with FakeKubeApi() as fake:
        fake.put_secret(NAMESPACE, NAME, {"username": " admin\n", "password": "s3cret\n"})
        yield fake


@pytest.fixture
def credentials(api: FakeKubeApi) -> Iterator[KubernetesSecretCredentials]:
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.host)))
    adapter = KubernetesSecretCredentials(
        core,
        SecretReference(NAMESPACE, NAME),
        watch_timeout_seconds=1,
        request_timeout_seconds=5,
        initial_backoff_seconds=0.05,
        max_backoff_seconds=0.2,
    )
    yield adapter
    adapter.close()


def test_reads_the_secret_decoded_and_trimmed_then_watches_it_by_name(
    api: FakeKubeApi, credentials: KubernetesSecretCredentials
) -> None:
    assert dict(credentials.current()) == {"username": "admin", "password": "s3cret"}

    eventually(lambda: bool(api.watch_requests()))
    assert api.requests[0] == SECRET_PATH
    assert api.watch_requests()[0] == (
        f"/api/v1/namespaces/{NAMESPACE}/secrets?fieldSelector=metadata.name%3D{NAME}"
        "&resourceVersion=101&timeoutSeconds=1&watch=true"
    )


def test_a_rotation_arrives_through_the_watch_without_another_read(
    api: FakeKubeApi, credentials: KubernetesSecretCredentials
) -> None:
    credentials.current()
    eventually(lambda: bool(api.watch_requests()))

    api.put_secret(NAMESPACE, NAME, {"username": "admin", "password": "rotated"})

    eventually(lambda: credentials.current().get("password") == "rotated")
    assert api.requests.count(SECRET_PATH) == 1


def test_a_rotation_is_reported_once_and_the_first_read_is_not(api: FakeKubeApi) -> None:
    reloads: list[int] = []
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.host)))
    adapter = KubernetesSecretCredentials(
        core,
        SecretReference(NAMESPACE, NAME),
        watch_timeout_seconds=1,
        on_reload=lambda: reloads.append(1),
    )
    try:
        adapter.current()
        eventually(lambda: bool(api.watch_requests()))
        assert reloads == []
        api.put_secret(NAMESPACE, NAME, {"username": "admin", "password": "rotated"})
        eventually(lambda: adapter.current().get("password") == "rotated")
        assert reloads == [1]
    finally:
        adapter.close()


def test_the_watch_resumes_from_the_last_version_after_the_server_ends_it(
    api: FakeKubeApi, credentials: KubernetesSecretCredentials
) -> None:
    credentials.current()
    api.put_secret(NAMESPACE, NAME, {"username": "admin", "password": "second"})
    eventually(lambda: credentials.current().get("password") == "second")

    eventually(lambda: any("resourceVersion=102" in path for path in api.watch_requests()))
    api.put_secret(NAMESPACE, NAME, {"username": "admin", "password": "third"})

    eventually(lambda: credentials.current().get("password") == "third")
    assert api.requests.count(SECRET_PATH) == 1


def test_an_unreachable_api_keeps_the_last_good_set_and_recovers(
    api: FakeKubeApi, credentials: KubernetesSecretCredentials, caplog: pytest.LogCaptureFixture
) -> None:
    credentials.current()
    api.stop()

    with caplog.at_level(logging.WARNING):
        assert dict(credentials.refresh()) == {"username": "admin", "password": "s3cret"}
    assert f"cannot read credentials Secret {NAMESPACE}/{NAME}" in caplog.text

    api.put_secret(NAMESPACE, NAME, {"username": "admin", "password": "while-down"})
    api.start()
    eventually(lambda: credentials.current().get("password") == "while-down")


def test_api_errors_keep_the_last_good_set_and_the_watcher_retries(
    api: FakeKubeApi, credentials: KubernetesSecretCredentials, caplog: pytest.LogCaptureFixture
) -> None:
    credentials.current()
    reads_before = api.requests.count(SECRET_PATH)
    api.fail_with(HTTPStatus.SERVICE_UNAVAILABLE)

    with caplog.at_level(logging.WARNING):
        assert dict(credentials.refresh()) == {"username": "admin", "password": "s3cret"}
    assert "HTTP 503 Service Unavailable" in caplog.text
    # refresh()'s read, then the watcher's own retry after its watch was refused:
    eventually(lambda: api.requests.count(SECRET_PATH) >= reads_before + 2)
    assert dict(credentials.current()) == {"username": "admin", "password": "s3cret"}

    api.put_secret(NAMESPACE, NAME, {"username": "admin", "password": "after-503"})
    api.fail_with(None)
    eventually(lambda: credentials.current().get("password") == "after-503")


def test_a_deleted_secret_keeps_the_last_good_set(
    api: FakeKubeApi, credentials: KubernetesSecretCredentials, caplog: pytest.LogCaptureFixture
) -> None:
    credentials.current()
    eventually(lambda: bool(api.watch_requests()))

    with caplog.at_level(logging.WARNING):
        api.delete_secret(NAMESPACE, NAME)
        eventually(lambda: "was deleted" in caplog.text)

    assert dict(credentials.current()) == {"username": "admin", "password": "s3cret"}


def test_a_secret_created_after_start_up_is_picked_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with FakeKubeApi() as api:
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.host)))
        credentials = KubernetesSecretCredentials(
            core, SecretReference(NAMESPACE, NAME), initial_backoff_seconds=0.05
        )
        try:
            with caplog.at_level(logging.WARNING):
                assert dict(credentials.current()) == {}
            assert "HTTP 404 Not Found" in caplog.text

            api.put_secret(NAMESPACE, NAME, {"username": "late"})
            eventually(lambda: credentials.current().get("username") == "late")
        finally:
            credentials.close()


def test_no_value_reaches_logs_or_reprs(
    api: FakeKubeApi, credentials: KubernetesSecretCredentials, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    values = credentials.current()
    api.put_secret(NAMESPACE, NAME, {"username": "admin", "password": "hunter2-rotated"})
    eventually(lambda: credentials.current().get("password") == "hunter2-rotated")
    api.fail_with(HTTPStatus.FORBIDDEN)
    credentials.refresh()
    api.fail_with(None)
    texts = [repr(credentials), str(credentials), repr(values), str(credentials.current())]

    assert "loaded credentials Secret" in caplog.text  # debug lines were written, and checked
    for secret in ("admin", "s3cret", "hunter2-rotated"):
        assert secret not in caplog.text
        assert all(secret not in text for text in texts)


@pytest.mark.parametrize(
    ("reference", "default_namespace", "expected"),
    [
        ("creds", "provider-ns", SecretReference("provider-ns", "creds")),
        ("other/creds", "provider-ns", SecretReference("other", "creds")),
        ("creds", "", SecretReference("pod-ns", "creds")),
    ],
)
def test_a_reference_is_name_or_namespace_slash_name(
    tmp_path: Path, reference: str, default_namespace: str, expected: SecretReference
) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("pod-ns\n")

    assert parse_secret_reference(reference, default_namespace, namespace_file) == expected


@pytest.mark.parametrize("reference", ["", "a/b/c", "ns/"])
def test_a_malformed_reference_is_refused(reference: str) -> None:
    with pytest.raises(ValueError, match="PYRIGAUD_CREDENTIALS_SECRET"):
        parse_secret_reference(reference, "ns")


def test_a_reference_without_any_namespace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="PROVIDER_NAMESPACE"):
        parse_secret_reference("creds", "", tmp_path / "no-namespace-file")
