"""Checksum manifests: the size and sha256 of each file of an artifact, recorded when it is written
(file_records) and checked when it is read (file_problems). Every artifact's manifest holds such records
(checkpoints, outputs, the event cache, the per-entity states, the extracts' records, training states).

Keyed manifests. Unkeyed checksums catch damage, not tampering: whoever edits a file can hash it again and
rewrite the manifest. When BASEMODEL_MANIFEST_KEY is set, every manifest is written `signed`: it also holds

    "signature": {"key_id": <first 8 hex digits of sha256(key)>, "hmac_sha256": <HMAC-SHA256 under the key
                  of the manifest's canonical JSON: every other field, keys sorted, no spaces>}

and `signature_problem` is what every reader that checks integrity asks first: with the key set, a manifest
without a signature, signed under another key or whose HMAC does not match is refused. Without the key, a
signature is left unchecked (`signature_note` says so to `basemodel verify`). The key id names the key
without revealing it; the key itself is never written, logged or put in a message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

from basemodel_pipeline.settings import setting

KEY_SETTING = "BASEMODEL_MANIFEST_KEY"
SIGNATURE = "signature"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_records(directory: Path, paths: list[Path]) -> dict[str, dict[str, Any]]:
    """{path relative to `directory`: {bytes, sha256}} of `paths`: what a checksum manifest records."""
    return {
        str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in paths
    }


def file_problems(directory: Path, files: dict[str, dict[str, Any]], manifest: str) -> list[str]:
    """The recorded `files` (as file_records writes them) that are missing, have another size or another
    sha256 under `directory`; [] when all match. `manifest` names the record in the messages."""
    found = []
    for rel, expected in sorted(files.items()):
        path = directory / rel
        if not path.is_file():
            found.append(f"{rel}: missing")
        elif (size := path.stat().st_size) != expected.get("bytes"):
            found.append(
                f"{rel}: {size:,} bytes, {manifest} says {expected.get('bytes'):,} (truncated or replaced)"
            )
        elif sha256_file(path) != expected.get("sha256"):
            found.append(f"{rel}: changed after it was written (sha256 differs from {manifest})")
    return found


def _key() -> bytes | None:
    value = setting(KEY_SETTING)
    return value.encode() if value else None


def key_id(key: bytes) -> str:
    """A name of the key that does not reveal it: the first 8 hex digits of its sha256."""
    return hashlib.sha256(key).hexdigest()[:8]


def _hmac(key: bytes, content: dict[str, Any]) -> str:
    """HMAC-SHA256 of the canonical JSON of `content` (as a reader parses it back)."""
    canonical = json.dumps(json.loads(json.dumps(content)), sort_keys=True, separators=(",", ":"))
    return hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()


def signed(record: dict[str, Any]) -> dict[str, Any]:
    """`record` as a manifest is written: with its signature when BASEMODEL_MANIFEST_KEY is set (a signature
    it carried already, copied from an older manifest, is dropped either way)."""
    content = {k: v for k, v in record.items() if k != SIGNATURE}
    key = _key()
    if key is None:
        return content
    return {**content, SIGNATURE: {"key_id": key_id(key), "hmac_sha256": _hmac(key, content)}}


def signature_problem(record: dict[str, Any], name: str) -> str | None:
    """Why the manifest `record` (read from the file `name`) cannot be trusted under BASEMODEL_MANIFEST_KEY,
    in the form "<name>: <what>"; None when the key is unset or the signature matches."""
    key = _key()
    if key is None:
        return None
    signature = record.get(SIGNATURE)
    if not isinstance(signature, dict) or not isinstance(signature.get("hmac_sha256"), str):
        return (
            f"{name}: not signed, and {KEY_SETTING} is set (written without the key, or its signature was "
            "removed)"
        )
    theirs, ours = str(signature.get("key_id"))[:16], key_id(key)
    if theirs != ours:
        return f"{name}: signed with another key (key id {theirs}; {KEY_SETTING}'s is {ours})"
    content = {k: v for k, v in record.items() if k != SIGNATURE}
    if not hmac.compare_digest(signature["hmac_sha256"].encode(), _hmac(key, content).encode()):
        return (
            f"{name}: its signature does not match its content under {KEY_SETTING}: the manifest was altered "
            "after it was written"
        )
    return None


def signature_note(record: dict[str, Any]) -> str:
    """What `basemodel verify` adds about a manifest that passed: whether its signature was checked."""
    if not isinstance(record.get(SIGNATURE), dict):
        return ""
    return "keyed, checked" if _key() is not None else f"keyed, not checked: {KEY_SETTING} unset"
