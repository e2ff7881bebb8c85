"""memfit test suite (a package, so that `tests.conftest` and same-named modules in subfolders import)."""
