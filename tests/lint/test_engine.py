"""The engine: the doctor's scripts and the examples, noqa, select/ignore, walking, MF000."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.errors import BadInputError
from memfit.lint import lint_paths, lint_source

ROOT = Path(__file__).parents[2]
SCRIPTS = ROOT / "tests" / "doctor_scripts"
LEAK = "total = 0.0\nfor x in data:\n    loss = model(x).sum()\n    loss.backward()\n"


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("clean_*.py")))
def test_the_doctors_clean_scripts_give_nothing(script):
    assert lint_paths([SCRIPTS / script]) == []


@pytest.mark.parametrize(
    "script, code",
    [("leak_total_loss.py", "MF001"), ("leak_outputs_list.py", "MF001"),
     ("leak_loss_held.py", "MF001"), ("eval_without_no_grad.py", "MF002"),
     ("retain_graph_loop.py", "MF003")],
)  # fmt: skip
def test_the_doctors_leaks_are_found_on_their_marked_line(script, code):
    path = SCRIPTS / script
    lines = path.read_text().splitlines()
    marked = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith("# LEAK")]
    found = lint_paths([path])
    assert [f.code for f in found] == [code]
    # The doctor marks the line that made the memory; the lint the line that keeps it.
    assert found[0].line in marked or code in ("MF001", "MF002")


def test_the_projects_examples_give_nothing():
    assert lint_paths([ROOT / "examples"]) == []


def test_noqa_bare_and_with_codes():
    store = LEAK + "    total += loss  # "
    noqa = "no" + "qa"  # spelled apart so that no linter reads these lines as directives
    assert lint_source(f"{store}{noqa}: MF001\n") == []
    assert lint_source(f"{store}{noqa}\n") == []
    assert lint_source(f"{store}{noqa.upper()}:MF002, MF001\n") == []
    # another tool's code does not silence this one
    assert [f.code for f in lint_source(f"{store}{noqa}: E501\n")] == ["MF001"]
    # a directive inside a string is not a comment
    assert lint_source(f"{LEAK}    total += loss; s = '# {noqa}'\n") != []


def test_select_and_ignore(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(LEAK + "    total += loss\nopt.zero_grad(set_to_none=False)\n")
    assert [x.code for x in lint_paths([f])] == ["MF001", "MF007"]
    assert [x.code for x in lint_paths([f], select=["MF007"])] == ["MF007"]
    assert [x.code for x in lint_paths([f], ignore=["MF001"])] == ["MF007"]
    assert [x.code for x in lint_paths([f], select=["mf00"], ignore=["MF007"])] == ["MF001"]
    assert [x.code for x in lint_paths([f], select=["ALL"])] == ["MF001", "MF007"]


def test_unknown_code_and_missing_path_say_the_fix(tmp_path):
    with pytest.raises(BadInputError, match=r"unknown rule code 'MF010'.*Known codes: MF001"):
        lint_paths([tmp_path], select=["MF010"])
    with pytest.raises(BadInputError, match=r"'MF0O1'.*Did you mean 'MF001'"):
        lint_paths([tmp_path], ignore=["MF0O1"])
    with pytest.raises(BadInputError, match=r"No such file or folder: '.*nope\.py'"):
        lint_paths([tmp_path / "nope.py"])


def test_folders_are_walked_skipping_virtualenvs_and_excludes(tmp_path):
    bad = LEAK + "    total += loss\n"
    for rel in ("a.py", "pkg/b.py", ".venv/c.py", "build/d.py", "legacy/e.py", "notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(bad)
    found = lint_paths([tmp_path], exclude=["legacy"])
    assert sorted(Path(f.path).relative_to(tmp_path).as_posix() for f in found) == [
        "a.py", "pkg/b.py"
    ]  # fmt: skip


def test_a_file_that_does_not_parse_is_mf000_whatever_is_ignored():
    (f,) = lint_source("def f(:\n    pass\n", "broken.py")
    assert (f.code, f.line, f.path) == ("MF000", 1, "broken.py")
    assert "cannot parse" in f.message


def test_columns_count_characters_not_bytes():
    src = "é = 1; opt.zero_grad(set_to_none=False)\n"
    (f,) = lint_source(src)
    assert f.column == src.index("opt") + 1
