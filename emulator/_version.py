"""The version of the package: its one source (pyproject.toml reads it; CHANGELOG.md says what each one changed)."""

__version__ = "0.9.0"
