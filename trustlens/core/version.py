"""The release of trustlens (pyproject.toml's `version`), written into every run.json and Parquet part."""

__version__ = "0.1.0"
