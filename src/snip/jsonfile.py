"""Reading the JSON files a user hands to snip (plans, sensitivity tables, masks, throughput
profiles, tokenizers), with one voice for what can be wrong with them.

Each input is a JSON *object*; anything else is the user's to fix and becomes a one-line
`UserError` that names the file and what it was meant to be::

    data = read_object(path, "mask file", hint="; build one with `snip audit --mask-out FILE`")

- a missing path: `MissingFileError` ("mask file m.json does not exist; build one ...");
- unreadable (permissions, a directory, bytes that are not UTF-8): "cannot read ...";
- not JSON: "... is not valid JSON: line 2, column 30: Expecting ',' delimiter";
- JSON, but not an object: "... must hold a JSON object, not list";
- an object with a key twice (JSON parsers keep the last silently: a hand-edited plan would
  lose a layer's entry): "... has the key 'a.wq' twice".

`flatten` gives the dotted view of a nested object (a config tree, a JSON record):
``{"train": {"steps": 5}}`` -> ``{"train.steps": 5}``.

This module sits below everything but `snip.errors`, beside `snip.atomic` (its writing side).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from snip.errors import MissingFileError, UserError


class _Twice(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Twice(k)
        out[k] = v
    return out


def loads(text: str, what: str) -> Any:
    """``text`` parsed as JSON, or a `UserError` saying where ``what`` stops being JSON (or
    which key one of its objects has twice)."""
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except json.JSONDecodeError as e:
        raise UserError(f"{what} is not valid JSON: line {e.lineno}, column {e.colno}: "
                        f"{e.msg}") from None
    except _Twice as e:
        raise UserError(f"{what} has the key {e.key!r} twice; keep one") from None


def read_object(path: str | Path, what: str, hint: str = "") -> dict[str, Any]:
    """The JSON object in the file ``path``; ``what`` names it in errors ("plan file"),
    ``hint`` follows the missing-file message."""
    path = Path(path)
    name = f"{what} {path}"
    if not path.is_file():
        raise MissingFileError(f"{name} does not exist{hint}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else "not UTF-8 text"
        raise UserError(f"cannot read {name}: {why}") from None
    data = loads(text, name)
    if not isinstance(data, dict):
        raise UserError(f"{name} must hold a JSON object, not {type(data).__name__}")
    return data


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"steps": 5}}`` -> ``{"train.steps": 5}`` (nested mappings only; lists stay
    values)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
