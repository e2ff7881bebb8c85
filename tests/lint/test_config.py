"""[tool.memfit.lint] in pyproject.toml."""

from __future__ import annotations

import pytest

from memfit.errors import BadInputError
from memfit.lint.config import find_config


def write(tmp_path, body):
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "x"\n\n{body}')
    sub = tmp_path / "src" / "pkg"
    sub.mkdir(parents=True)
    return sub


def test_nearest_pyproject_table_is_read(tmp_path):
    sub = write(tmp_path, '[tool.memfit.lint]\nselect = ["MF00"]\nignore = "MF004"\n'
                          'exclude = ["legacy/*"]\n')  # fmt: skip
    cfg = find_config(sub)
    assert (cfg.select, cfg.ignore, cfg.exclude) == (("MF00",), ("MF004",), ("legacy/*",))
    assert cfg.source == tmp_path / "pyproject.toml"


def test_no_table_means_defaults(tmp_path):
    cfg = find_config(write(tmp_path, "[tool.ruff]\nline-length = 100\n"))
    assert (cfg.select, cfg.ignore, cfg.exclude) == (None, None, ())


@pytest.mark.parametrize(
    "body, match",
    [
        ('[tool.memfit.lint]\nselct = ["MF001"]\n', r"unknown key 'selct'.*'select'"),
        ("[tool.memfit.lint]\nselect = 1\n", r"select = 1 is not a list of strings"),
        ("[tool.memfit.lint\n", r"not valid TOML"),
    ],
)
def test_bad_table_says_the_fix(tmp_path, body, match):
    with pytest.raises(BadInputError, match=match):
        find_config(write(tmp_path, body))
