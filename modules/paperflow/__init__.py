"""paperflow: reproducible Snakemake pipelines for ICML 2026 papers."""

__version__ = "0.1.0"
