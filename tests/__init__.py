"""The memfit test suite. A package, so that `tests.conftest` imports and same-named modules
in subfolders stay apart."""
