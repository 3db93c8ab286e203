"""Weak pins get strong (issue 43): a file the config pins only by a publisher's md5 or a sha256 prefix has its
sha256 recorded in the paper's lock file on its first download and checked on every later one; a file that
matches the weak pin but not the recorded sha256 is refused with one line naming the file, both hashes and what
to do; `require_sha256`, the guard before unpickling a downloaded file, passes only a file whose sha256 is pinned
or recorded. Against a loopback HTTP server whose payload a test may swap."""

from __future__ import annotations

import hashlib
import json
import pickle

import pytest

from paperflow.core.config import ConfigError
from paperflow.core.download import (
    PIN_ENV,
    ChecksumMismatch,
    RecordedSha256Mismatch,
    WeakPinError,
    fetch,
    lock_path,
    pinned_fetch,
    read_lock,
    require_sha256,
    sha256_file,
)

FAST = {"backoff_s": 0.01, "timeout_s": 5.0, "progress": False}


@pytest.fixture
def server(serve_bytes):
    """A loopback server whose payload the test may change: (url, state with 'payload' and 'hits')."""
    state = {"payload": b"first version\n"}
    base, state["hits"] = serve_bytes(state)
    return f"{base}/data/file.bin", state


@pytest.fixture(autouse=True)
def _no_pin_run(monkeypatch):
    monkeypatch.delenv(PIN_ENV, raising=False)  # recording a weak pin's sha256 needs no `paperflow pin`


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _prefix_twins(digits: int = 8) -> tuple[bytes, bytes]:
    """Two different payloads whose sha256 share the first `digits` hex digits (a birthday search: about 2**16
    hashes for 8 digits), the collision a `sha256-prefix:` pin cannot tell apart."""
    seen: dict[str, bytes] = {}
    i = 0
    while True:
        data = b"payload %d\n" % i
        prefix = _sha(data)[:digits]
        if prefix in seen:
            return seen[prefix], data
        seen[prefix] = data
        i += 1


def _get(url, dest, pin, root, **kw):
    return pinned_fetch(url, dest, pin, slug="demo", key="datasets.x.sha256", root=root, **FAST, **kw)


def test_first_download_records_the_sha256_and_later_ones_verify_it(server, tmp_path, caplog):
    url, state = server
    pin = "md5:" + _md5(state["payload"])
    dest = _get(url, tmp_path / "a" / "f.bin", pin, tmp_path)
    assert dest.read_bytes() == state["payload"] and len(state["hits"]) == 1
    entry = read_lock("demo", tmp_path)[url]
    assert entry["sha256"] == _sha(state["payload"]) and entry["bytes"] == len(state["payload"])
    assert entry["first_checked_with"] == pin
    doc = json.loads(lock_path("demo", tmp_path).read_text())
    assert "md5" in doc["comment"] and not list(lock_path("demo", tmp_path).parent.glob("*.tmp"))
    # the file on disk: checked against both, no request
    with caplog.at_level("INFO", logger="paperflow.download"):
        assert _get(url, dest, pin, tmp_path) == dest
    assert len(state["hits"]) == 1 and "publisher's md5 and recorded sha256" in caplog.text
    # a fresh download: checked against both, and the record is not rewritten
    assert _get(url, tmp_path / "b" / "f.bin", pin, tmp_path).read_bytes() == state["payload"]
    assert len(state["hits"]) == 2 and read_lock("demo", tmp_path)[url] == entry


def test_a_full_sha256_pin_writes_no_lock(server, tmp_path):
    url, state = server
    _get(url, tmp_path / "f.bin", _sha(state["payload"]), tmp_path)
    assert not lock_path("demo", tmp_path).exists()


def test_a_server_file_swapped_for_one_with_the_same_prefix_is_refused(server, tmp_path):
    url, state = server
    first, twin = _prefix_twins()
    assert first != twin and _sha(first)[:8] == _sha(twin)[:8]
    pin = "sha256-prefix:" + _sha(first)[:8]
    state["payload"] = first
    _get(url, tmp_path / "a" / "f.bin", pin, tmp_path)
    state["payload"] = twin  # the prefix pin alone would take it
    dest = tmp_path / "b" / "f.bin"
    with pytest.raises(RecordedSha256Mismatch) as caught:
        _get(url, dest, pin, tmp_path)
    message = str(caught.value)
    assert "\n" not in message and str(dest) in message and url in message
    assert _sha(twin) in message and _sha(first) in message and "matches its sha256 prefix" in message
    assert str(lock_path("demo", tmp_path)) in message and "delete the entry" in message
    assert not dest.exists() and not dest.with_name("f.bin.part").exists()
    assert read_lock("demo", tmp_path)[url]["sha256"] == _sha(first)  # the record stays


def test_a_local_copy_swapped_for_a_prefix_twin_is_downloaded_again(server, tmp_path):
    url, state = server
    first, twin = _prefix_twins()
    pin = "sha256-prefix:" + _sha(first)[:8]
    state["payload"] = first
    dest = _get(url, tmp_path / "f.bin", pin, tmp_path)
    dest.write_bytes(twin)
    assert _get(url, dest, pin, tmp_path).read_bytes() == first and len(state["hits"]) == 2


def test_an_md5_collision_is_refused(server, tmp_path):
    """An md5 collision, simulated: the lock records another sha256 for the URL, as it would after the publisher's
    file was swapped for a colliding one. The file on disk and a fresh download are both refused."""
    url, state = server
    pin = "md5:" + _md5(state["payload"])
    dest = _get(url, tmp_path / "f.bin", pin, tmp_path)
    lock = lock_path("demo", tmp_path)
    doc = json.loads(lock.read_text())
    other = _sha(b"the bytes first downloaded\n")
    doc["files"][url]["sha256"] = other
    lock.write_text(json.dumps(doc))
    with pytest.raises(RecordedSha256Mismatch) as caught:
        _get(url, dest, pin, tmp_path)
    message = str(caught.value)
    assert f"matches its publisher's md5 {_md5(state['payload'])}" in message
    assert _sha(state["payload"]) in message and other in message and str(dest) in message and "\n" not in message
    assert not dest.exists()  # a copy that fails the check is not left for a later job
    assert isinstance(caught.value, ChecksumMismatch)  # callers that catch a mismatch still do


def test_a_file_that_matches_neither_names_both(server, tmp_path):
    url, state = server
    pin = "md5:" + _md5(state["payload"])
    _get(url, tmp_path / "a.bin", pin, tmp_path)
    state["payload"] = b"second version\n"
    with pytest.raises(RecordedSha256Mismatch, match=r"does not match its publisher's md5 .* either \(it has "):
        _get(url, tmp_path / "b.bin", pin, tmp_path)


def test_a_recording_race_keeps_the_first_record(server, tmp_path, monkeypatch):
    """Another job recorded other bytes for the URL between this job's read of the lock and its write."""
    url, state = server
    lock = lock_path("demo", tmp_path)
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"files": {url: {"sha256": "1" * 64}}}))
    monkeypatch.setattr("paperflow.core.download.read_lock", lambda slug, root=None: {})
    dest = tmp_path / "f.bin"
    with pytest.raises(RecordedSha256Mismatch, match="1" * 64):
        _get(url, dest, "md5:" + _md5(state["payload"]), tmp_path)
    assert not dest.exists() and json.loads(lock.read_text())["files"][url]["sha256"] == "1" * 64


def test_a_pickle_is_never_loaded_from_a_file_verified_by_md5_alone(server, tmp_path):
    url, state = server
    state["payload"] = pickle.dumps({"gene": [1.0, 2.0]})
    pin = "md5:" + _md5(state["payload"])
    # verified by md5 alone (a plain fetch records nothing): refused, in one line naming the file and the remedy
    plain = fetch(url, tmp_path / "plain.pickle", pin, **FAST)
    for given in (None, pin):
        with pytest.raises(WeakPinError) as caught:
            require_sha256(plain, slug="demo", sha256=given, key="embedding.x.sha256", root=tmp_path)
        message = str(caught.value)
        assert "\n" not in message and str(plain) in message and "paperflow pin demo" in message
        assert "embedding.x.sha256" in message and sha256_file(plain) in message
    assert issubclass(WeakPinError, ConfigError)
    # through the pinned download its sha256 is recorded: the guard passes (the file may have moved since)
    got = _get(url, tmp_path / "cache" / "e.pickle", pin, tmp_path)
    moved = got.rename(tmp_path / "e.pickle")
    assert require_sha256(moved, slug="demo", root=tmp_path) == _sha(state["payload"])
    assert pickle.loads(moved.read_bytes()) == {"gene": [1.0, 2.0]}
    # a full sha256 in the config passes without a lock entry; a different file does not
    (tmp_path / "other.pickle").write_bytes(pickle.dumps("x"))
    other = tmp_path / "other.pickle"
    assert require_sha256(other, slug="demo", sha256=sha256_file(other), root=tmp_path) == sha256_file(other)
    with pytest.raises(WeakPinError, match="neither pinned in the config nor recorded"):
        require_sha256(other, slug="demo", sha256=_sha(b"else"), root=tmp_path)
    with pytest.raises(WeakPinError, match="no such file"):
        require_sha256(tmp_path / "missing.pickle", slug="demo", root=tmp_path)
