"""The vendored scripts are the engine's, byte for byte: compared (SHA1) with the repo's
lua/ and, when the delayq binary has the verb, with ``delayq scripts export DIR``."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from delayq import _core
from conftest import BIN, REPO, run_bin

NAMES = sorted(_core.SCRIPTS)


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def test_every_script_the_sdk_runs_is_vendored():
    assert NAMES == ["cancel", "create_queue", "enqueue", "get", "order_rules", "reschedule", "tag_bulk"]
    # The enqueue contract of issue 22: the shard's due, payload and marker as KEYS[1..3] and
    # the epoch as ARGV[3].
    assert b"KEYS[3]  the shard's meta HASH" in _core.ENQUEUE.text and b"stale_epoch" in _core.ENQUEUE.text
    # Issue 26: the levels HASH as KEYS[4] (enqueue), KEYS[3] (cancel, get), KEYS[2] and the
    # new level as ARGV[3] (reschedule).
    assert b"KEYS[4]  the shard's levels HASH" in _core.ENQUEUE.text and b"quadruples" in _core.ENQUEUE.text
    for script in (_core.CANCEL, _core.GET):
        assert b"KEYS[3]  the shard's levels HASH" in script.text, script.name
    assert b"KEYS[2]  the shard's levels HASH" in _core.RESCHEDULE.text
    assert b"ARGV[3]  optional: the new level" in _core.RESCHEDULE.text


# Issue 40: each script the SDK runs with shard keys takes one KEYS arity, and this SDK
# passes exactly that many (a call with another count is refused before any write).
ARITY = {"enqueue": 10, "cancel": 8, "get": 4, "reschedule": 5, "tag_bulk": 8}


@pytest.mark.parametrize("name", sorted(ARITY))
def test_each_script_takes_one_keys_arity_none_optional(name: str) -> None:
    n = ARITY[name]
    text = _core.SCRIPTS[name].text
    header = []
    for line in text.splitlines():
        if line.startswith(b"#!"):
            continue
        if not line.startswith(b"--"):
            break
        header.append(line)
    keys = [l for l in header if l.startswith(b"-- KEYS[")]
    assert keys and not any(b"optional" in l for l in keys), name
    assert any(l.startswith(b"-- KEYS[%d]" % n) or b", KEYS[%d]" % n in l for l in keys), name
    assert b"Always all %d KEYS" % n in text, name
    assert b"if #KEYS ~= %d then return redis.error_reply('ERR delayq %s: %d KEYS expected') end" % (n, name.encode(), n) in text, name


def _header_and_body(text: bytes) -> tuple[bytes, bytes]:
    """A script file's header (its leading ``--`` lines) and the rest."""
    lines = text.splitlines(keepends=True)
    n = 0
    while n < len(lines) and lines[n].startswith(b"--"):
        n += 1
    return b"".join(lines[:n]), b"".join(lines[n:])


@pytest.mark.parametrize("name", NAMES)
def test_vendored_copy_matches_the_repo(name):
    # The engine runs lua/<name>.lua with the includes its header names (``-- @include
    # a, b``: lua/include/<a>.lua, each after its own includes) put in after its header:
    # the vendored copy is the repo's header, those includes, then the repo's body.
    vendored = _core.SCRIPTS[name].text
    repo = (REPO / "lua" / f"{name}.lua").read_bytes()
    # A read-only script's flags line (``#!lua flags=no-writes``, unknown to Redis 6.2) is
    # not in the export, which runs on every supported server.
    if repo.startswith(b"#!"):
        repo = repo.split(b"\n", 1)[1]
    header, body = _header_and_body(repo)
    hint = (
        f"sdk/python/src/delayq/lua/{name}.lua differs from lua/{name}.lua: export it again "
        f"(delayq scripts export DIR, then copy DIR/{name}.lua to sdk/python/src/delayq/lua/)"
    )
    assert vendored.startswith(header) and vendored.endswith(body), hint
    middle = vendored[len(header) : len(vendored) - len(body)]
    named = [
        n.strip()
        for line in header.splitlines()
        if line.startswith(b"-- @include ")
        for n in line[len(b"-- @include ") :].split(b",")
    ]
    for inc in named:
        text = (REPO / "lua" / "include" / f"{inc.decode()}.lua").read_bytes()
        assert middle.count(text) == 1, f"{name}.lua: include {inc!r} is not in it once"
    for f in sorted((REPO / "lua" / "include").glob("*.lua")):
        middle = middle.replace(f.read_bytes(), b"", 1)
    assert middle.strip(b"\n") == b"", hint
    assert _core.SCRIPTS[name].sha == sha1(vendored)


def _has_export_verb() -> bool:
    p = subprocess.run([BIN, "--help"], capture_output=True, text=True, timeout=30)
    return any(line.split()[:1] == ["scripts"] for line in p.stdout.splitlines())


def test_vendored_copies_match_the_binarys_export(tmp_path):
    if not _has_export_verb():
        pytest.skip("this delayq binary has no `scripts export` verb yet (compared with lua/ above)")
    out = run_bin("scripts", "export", str(tmp_path)).stdout
    printed = {}
    for line in out.splitlines():
        if line.strip().startswith("{"):
            rec = json.loads(line)
            printed[rec["script"]] = rec["sha1"]
    for name in NAMES:
        exported = (tmp_path / f"{name}.lua").read_bytes()
        assert sha1(_core.SCRIPTS[name].text) == sha1(exported), f"{name}.lua differs from the engine's"
        if printed:
            # The SHA1 the engine prints is the one the SDK sends with EVALSHA.
            assert printed.get(name) == _core.SCRIPTS[name].sha, name
