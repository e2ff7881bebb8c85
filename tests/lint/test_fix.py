"""--fix: the edits, applied, give a file the lint passes and that still compiles."""

from __future__ import annotations

from memfit.lint import lint_paths, lint_source
from memfit.lint.finding import Edit
from memfit.lint.fix import apply_edits, fix_files

SRC = """import torch
model = torch.nn.Linear(4, 1)
total, losses = 0.0, []
for x in torch.randn(3, 2, 4):
    loss = model(x).sum()
    loss.backward()
    total += loss * 2
    losses.append(loss)
print(total / 3, len(losses))
"""


def test_fix_roundtrip(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(SRC)
    found = lint_paths([f])
    assert [(x.line, x.fixable) for x in found] == [(7, True), (8, True)]
    assert fix_files(found) == {str(f): 2}
    fixed = f.read_text()
    assert "    total += loss.item() * 2\n" in fixed
    assert "    losses.append(loss.item())\n" in fixed  # only its length is read
    compile(fixed, str(f), "exec")
    assert lint_paths([f]) == []


def test_fix_keeps_a_tensor_where_one_is_used_later():
    src = SRC.replace("len(losses)", "torch.stack(losses).mean()")
    (f,) = [x for x in lint_source(src) if x.line == 8]
    assert [e.text for e in f.edits] == [".detach()"]


def test_apply_edits_keeps_line_endings_and_inserts_from_the_end():
    src = "a = b\r\nc = d + d\r\n"
    edits = [Edit(line=2, column=5, text="X"), Edit(line=2, column=9, text="Y")]
    assert apply_edits(src, edits) == "a = b\r\nc = dX + dY\r\n"
