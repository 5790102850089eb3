"""Shared error type and small file helpers for the barellm conversion tools."""

import json
import os


class ConvertError(Exception):
    """A conversion failure with a message meant for the user (no traceback)."""


def read_json(path, required=True):
    """Parse the JSON file at `path`; return None when it is absent and not required."""
    if not os.path.exists(path):
        if required:
            raise ConvertError(f"{path}: file not found")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConvertError(f"{path}: invalid JSON ({e})") from None
    except OSError as e:
        raise ConvertError(f"{path}: cannot read ({e.strerror})") from None


def compact_json(value):
    """Serialize `value` as compact UTF-8 JSON text (no spaces, non-ASCII kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
