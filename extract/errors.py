"""Errors of extraction, shared by the extractors and rematerialization (memory.py), which re-extracts."""


class ExtractionError(RuntimeError):
    """No well-typed program could be extracted (under the constraints given)."""
