"""Shared library used by every paper pipeline: config, provenance, download, training glue, reports."""
