"""A --user-dir plugin for the tests: imported as a package, it registers a toy arch and a toy criterion."""

from seqtrain_toy_plugin import arch, criterion  # noqa: F401  (each registers on import)
