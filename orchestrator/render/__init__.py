"""Batch scripts from templates/: the request each backend needs, rendered (dry run stops here)."""
