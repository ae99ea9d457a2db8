"""A local S3 server (moto) on 127.0.0.1 for the object-store tests, started and stopped by the
test session; never a real cloud.

tests/conftest.py registers this module as a plugin, so its fixtures are there in every test
(a test using them is skipped when boto3, moto or s3fs is missing):

    from s3_server import BUCKET, keys

    def test_something(s3):  # s3: a boto3 client; AWS_* variables point at the server
        ...
"""

from __future__ import annotations

import socket

import pytest

BUCKET = "trustlens-test"


@pytest.fixture(scope="session")
def s3_endpoint():
    """The URL of a moto S3 server on a free port of 127.0.0.1, for the whole test session."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    """Credentials and endpoint in the standard environment variables (child processes inherit
    them); a fresh bucket BUCKET; a boto3 client on it. The working directory is `tmp_path`, and
    the test fails if anything was written to a local folder named "s3:" there."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    boto3 = pytest.importorskip("boto3")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)
    s3fs.S3FileSystem.clear_instance_cache()  # no later test reuses a filesystem with these credentials
    assert not (tmp_path / "s3:").exists()


def keys(client, prefix: str) -> list[str]:
    """The keys below `prefix` in BUCKET, listed by the server itself, relative to `prefix`."""
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix) :] for o in listed)
