"""The version of the `--json` contract: every document carries it as its `schema` key.

The shape of each command's document is shipped as a JSON Schema in data/schemas/, generated
from tools/contract.py (`python -m tools.contract --write`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Raise it when a document loses, renames or retypes a key; a key added is no break.
SCHEMA_VERSION = 1


def versioned(document: Mapping[str, Any]) -> dict[str, Any]:
    """Return the document with the contract's version as its first key."""
    return {"schema": SCHEMA_VERSION, **document}
