"""Shared error type and small file helpers for the barellm conversion tools."""

import json
import os
import re

# A JSON escape of half a UTF-16 surrogate pair, \uD800 to \uDFFF.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


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
            text = f.read()
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConvertError(f"{path}: invalid JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise ConvertError(f"{path}: not UTF-8 text (at byte {e.start})") from None
    except OSError as e:
        raise ConvertError(f"{path}: cannot read ({e.strerror})") from None
    if SURROGATE_ESCAPE.search(text):  # half of a pair, which alone is not UTF-8 text
        try:
            compact_json(value).encode("utf-8")
        except UnicodeEncodeError:
            raise ConvertError(f"{path}: invalid JSON (a \\u escape of a lone surrogate, "
                               "which is not a character)") from None
    return value


def compact_json(value):
    """Serialize `value` as compact UTF-8 JSON text (no spaces, non-ASCII kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
