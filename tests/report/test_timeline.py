"""Tests of the timeline renderers (memfit.report.timeline): data by category, PNG and HTML."""

from __future__ import annotations

import subprocess
import sys

import pytest

from memfit.errors import BadInputError
from memfit.events import ALLOC, CATEGORIES, FREE, Event, StorageRecord
from memfit.profile import MemoryProfile
from memfit.report.timeline import (
    category_timeline,
    phase_spans,
    render_png,
    sample_indices,
)
from memfit.report.timeline_html import render_html
from memfit.units import format_bytes


def _rec(sid, nbytes, category, phase, module="lin", host=False):
    return StorageRecord(sid, nbytes, category, phase, 0, f"op{sid}", module, -1, 0, host=host)


def _ev(kind, sid, phase):
    return Event(kind, sid, phase, 0, f"op{sid}", "lin", -1)


def hand_profile() -> MemoryProfile:
    """A step by hand. Device sizes are rounded up to 512 B (CUDA caching allocator):
    1000 -> 1024, 100 -> 512, 2000 -> 2048, 513 -> 1024; the host storage counts 0."""
    records = {
        0: _rec(0, 1000, "parameters", "setup"),
        1: _rec(1, 100, "inputs", "forward", module=""),
        2: _rec(2, 2000, "activations", "forward"),
        3: _rec(3, 513, "temporaries", "forward"),
        4: _rec(4, 4096, "optimizer_state", "optimizer", host=True),
        5: _rec(5, 2000, "gradients", "backward", module=""),
    }
    events = [
        _ev(ALLOC, 0, "setup"),
        _ev(ALLOC, 1, "forward"),
        _ev(ALLOC, 2, "forward"),
        _ev(ALLOC, 3, "forward"),
        _ev(FREE, 3, "forward"),
        Event(ALLOC, 5, "backward", 0, "op5", "", -1),  # the peak: 1024 + 512 + 2048 + 2048
        _ev(FREE, 2, "backward"),
        _ev(FREE, 1, "backward"),
        _ev(ALLOC, 4, "optimizer"),
        _ev(FREE, 4, "optimizer"),
    ]
    return MemoryProfile.from_events(records, events)


EXPECTED = {
    "parameters": [1024] * 10,
    "inputs": [0, 512, 512, 512, 512, 512, 512, 0, 0, 0],
    "activations": [0, 0, 2048, 2048, 2048, 2048, 0, 0, 0, 0],
    "temporaries": [0, 0, 0, 1024, 0, 0, 0, 0, 0, 0],
    "gradients": [0, 0, 0, 0, 0, 2048, 2048, 2048, 2048, 2048],
}
EXPECTED_TOTAL = [1024, 1536, 3584, 4608, 3584, 5632, 3584, 3072, 3072, 3072]


def test_category_timeline_exact_on_hand_stream():
    p = hand_profile()
    ct = category_timeline(p)
    for c in CATEGORIES:
        assert list(ct.by_category[c]) == EXPECTED.get(c, [0] * 10), c
    assert list(ct.total) == EXPECTED_TOTAL == p.timeline
    assert ct.present() == ["parameters", "gradients", "inputs", "activations", "temporaries"]
    # At the peak the columns are the profile's breakdown.
    assert p.peak_index == 5 and p.peak_allocated_bytes == 5632
    assert {c: ct.by_category[c][5] for c in CATEGORIES} == p.breakdown


def test_phase_spans_and_sampling():
    assert phase_spans(hand_profile()) == [
        (0, 1, "setup"),
        (1, 5, "forward"),
        (5, 8, "backward"),
        (8, 10, "optimizer"),
    ]
    values = (0, 5, 1, 9, 2, 3, 8, 0)
    assert sample_indices(values, 3, 100) == list(range(8))
    # Two buckets, [0, 4) and [4, 8): min and max of each, plus first, last and the peak.
    assert sample_indices(values, 3, 4) == [0, 3, 6, 7]
    assert 5 in sample_indices(values, 5, 4)


def test_profile_without_stream_is_refused():
    p = hand_profile()
    p.events = []
    with pytest.raises(BadInputError, match=r"MemoryProfile\.from_events"):
        category_timeline(p)


def test_png_is_written(tmp_path):
    from matplotlib.image import imread

    p = hand_profile()
    p.peak_reserved_bytes = 2 * 1024 * 1024
    out = tmp_path / "t.png"
    render_png(p, out, title="hand")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(out).shape == (600, 1200, 4)  # 12 x 6 inches at 100 dpi, RGBA


def test_png_without_matplotlib_says_which_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"memfit\[plot\]"):
        render_png(hand_profile(), tmp_path / "t.png")


def test_html_is_self_contained_and_escaped(tmp_path):
    p = hand_profile()
    p.peak_reserved_bytes = 2 * 1024 * 1024
    out = tmp_path / "t.html"
    render_html(p, out, title="<b>hand</b>")
    text = out.read_text()
    assert "http" not in text and "<script" not in text and "<link" not in text
    assert "&lt;b&gt;hand&lt;/b&gt;" in text and "<b>hand</b>" not in text
    assert format_bytes(5632) == "5.50 KiB" and "peak 5.50 KiB" in text
    assert "reserved (simulated) 2.00 MiB" in text
    assert "op5 in &lt;top&gt; (backward, step 0)" in text  # peak op and module, escaped
    for c in ("parameters", "gradients", "inputs", "activations", "temporaries"):
        assert f"<title>{c}</title>" in text  # one band per category present
    assert "<title>optimizer_state</title>" not in text
    for phase in ("setup", "forward", "backward", "optimizer"):
        assert f"<title>{phase}</title>" in text


@pytest.fixture(scope="module")
def gpt2_profile() -> MemoryProfile:
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    import memfit

    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    cfg.bos_token_id = cfg.eos_token_id = 0
    est = memfit.estimate(GPT2LMHeadModel(cfg), memfit.Workload(batch_size=2, seq_len=16))
    return est.profile


def test_real_estimate_sums_and_renders(gpt2_profile, tmp_path):
    p = gpt2_profile
    ct = category_timeline(p)
    assert list(ct.total) == p.timeline
    for i in range(len(p.timeline)):
        assert sum(ct.by_category[c][i] for c in CATEGORIES) == p.timeline[i]
    assert {c: ct.by_category[c][p.peak_index] for c in CATEGORIES} == p.breakdown
    render_png(p, tmp_path / "g.png", max_points=200)  # downsampled
    render_html(p, tmp_path / "g.html", max_points=200)
    text = (tmp_path / "g.html").read_text()
    assert f"peak {format_bytes(p.peak_allocated_bytes)}" in text
    assert "http" not in text


def test_renderers_do_not_import_matplotlib():
    code = (
        "import sys, memfit.report.timeline, memfit.report.memory_viz\n"
        "assert 'matplotlib' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_peak_label_is_not_crossed_by_the_reserved_line():
    # Issue 29: the HTML timeline's reserved line ran through the peak's label.
    from memfit.report.timeline_html import _ASCENT, _DESCENT, _LINE, peak_label_y

    def crossed(baseline: float, line_y: float) -> bool:
        return baseline - _ASCENT <= line_y <= baseline + _LINE + _DESCENT

    peak_y = 200.0
    assert peak_label_y(peak_y, None) == peak_y - 18
    assert peak_label_y(peak_y, 100.0) == peak_y - 18  # far above: left where it was
    for reserved_y in (176.0, 182.0, 190.0, 197.0):  # inside the label's two lines
        assert crossed(peak_y - 18, reserved_y)
        assert not crossed(peak_label_y(peak_y, reserved_y), reserved_y)
