"""Model sources (memfit.models.sources, factory, hf_tasks): what a config.json, a factory file
and an nn.Module resolve to, and the errors a bad one gives (BadInputError naming the value and
the fix, never a traceback of memfit's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from memfit.errors import BadInputError
from memfit.estimator.trace.step_runner import make_batch_for
from memfit.models.sources import ModelSpec, resolve_model
from memfit.workload import Workload
from tests.conftest import TINY_BART

TINY_LLAMA = {
    "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 64,
}  # fmt: skip
TINY_BERT = {
    "vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 64, "max_position_embeddings": 64,
}  # fmt: skip


def write_config(tmp_path: Path, name: str, fields: dict) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(fields))
    return str(path)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- config.json


def test_encoder_decoder_config_without_architectures_is_a_seq2seq_lm(tmp_path):
    path = write_config(tmp_path, "bart", {"model_type": "bart", **TINY_BART})
    spec = resolve_model(path)
    assert (spec.task, spec.input_kind, spec.loss) == ("seq2seq-lm", "seq2seq-tokens", "hf")
    model = spec.build(None, "sdpa")
    assert type(model).__name__ == "BartForConditionalGeneration"
    # V*h + 2 position tables (64+2)*h + 2 embedding norms + 2 encoder layers + 2 decoder
    # layers (see tests/estimator/test_sources_agree.py): not the 2-layer decoder alone.
    assert n_params(model) == 51_200
    # Every task transformers has a BART head for is accepted, seq2seq-lm by name too.
    assert resolve_model(path, task="seq2seq-lm").task == "seq2seq-lm"
    causal = resolve_model(path, task="causal-lm")
    assert causal.input_kind == "tokens"
    assert type(causal.build(None, "sdpa")).__name__ == "BartForCausalLM"
    assert resolve_model(path, task="seq-classification").input_kind == "seq2seq-tokens"


def test_default_task_rule(tmp_path):
    # No architectures, one training objective: llama is a causal LM, vit an image classifier.
    llama = write_config(tmp_path, "llama", {"model_type": "llama", **TINY_LLAMA})
    assert resolve_model(llama).task == "causal-lm"
    vit = write_config(tmp_path, "vit", {"model_type": "vit", "hidden_size": 32,
                                         "num_hidden_layers": 2, "num_attention_heads": 4,
                                         "intermediate_size": 64, "image_size": 32,
                                         "patch_size": 8})  # fmt: skip
    spec = resolve_model(vit)
    assert (spec.task, spec.input_kind, spec.image_size, spec.max_positions) == (
        "image-classification", "image", 32, None,
    )  # fmt: skip
    # architectures decides when given.
    bert = write_config(tmp_path, "bert", {"model_type": "bert", **TINY_BERT,
                                           "architectures": ["BertForMaskedLM"]})  # fmt: skip
    assert resolve_model(bert).task == "masked-lm"
    # BERT without architectures has two objectives: memfit asks, listing the tasks.
    bare = write_config(tmp_path, "bert_bare", {"model_type": "bert", **TINY_BERT})
    with pytest.raises(BadInputError) as info:
        resolve_model(bare)
    msg = str(info.value)
    assert bare in msg and "--task" in msg and "causal-lm, masked-lm" in msg
    assert resolve_model(bare, task="masked-lm").task == "masked-lm"


def test_task_the_model_type_lacks_lists_what_it_has(tmp_path):
    path = write_config(tmp_path, "llama", {"model_type": "llama", **TINY_LLAMA})
    with pytest.raises(BadInputError) as info:
        resolve_model(path, task="seq2seq-lm")
    msg = str(info.value)
    assert "'seq2seq-lm'" in msg and "causal-lm, seq-classification" in msg and path in msg


def test_unknown_model_type_names_the_closest(tmp_path):
    path = write_config(tmp_path, "typo", {"model_type": "lama", "hidden_size": 32})
    with pytest.raises(BadInputError) as info:
        resolve_model(path)
    msg = str(info.value)
    assert "'lama'" in msg and "'llama'" in msg and path in msg
    assert len(msg) < 400  # the closest names, not transformers' hundreds


def test_hidden_size_not_divisible_by_heads_names_the_file(tmp_path):
    bad = {**TINY_LLAMA, "hidden_size": 100, "num_attention_heads": 3}
    # transformers validates Llama's config itself: caught when the source is resolved.
    llama = write_config(tmp_path, "llama", {"model_type": "llama", **bad})
    with pytest.raises(BadInputError) as info:
        resolve_model(llama)
    assert llama in str(info.value) and "(100)" in str(info.value) and "(3)" in str(info.value)
    # BERT's layers check it when built: caught there, with the file's name too.
    bert = write_config(tmp_path, "bert", {"model_type": "bert", **TINY_BERT, "hidden_size": 100,
                                           "num_attention_heads": 3,
                                           "architectures": ["BertForMaskedLM"]})  # fmt: skip
    spec = resolve_model(bert)
    with pytest.raises(BadInputError) as info:
        spec.build(None, "sdpa")
    msg = str(info.value)
    assert bert in msg and "(100)" in msg and "(3)" in msg and "attn_implementation" not in msg


# ----------------------------------------------------------------------------- factories


def write_factory(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


LLAMA_FACTORY = (
    "import transformers\n"
    f"CONFIG = {TINY_LLAMA!r}\n"
    "def build():\n"
    "    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))\n"
)


def test_factory_of_a_transformers_head_gets_its_task_and_loss(tmp_path):
    path = write_factory(tmp_path, "llama_factory", LLAMA_FACTORY)
    spec = resolve_model(f"{path}:build")
    assert (spec.task, spec.input_kind, spec.loss, spec.max_positions) == (
        "causal-lm", "tokens", "hf", 64,
    )  # fmt: skip
    assert spec.notes == [] and not spec.batch_is_user_defined
    with torch.device("meta"):
        model = spec.build(None, "sdpa")
    batch = make_batch_for(spec, model, Workload(batch_size=2, seq_len=8), torch.float32)
    assert sorted(batch) == ["input_ids", "labels"]
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 8)
    # The head is the model's: a different task cannot apply.
    with pytest.raises(BadInputError, match="LlamaForCausalLM"):
        resolve_model(f"{path}:build", task="seq-classification")


def test_plain_module_states_the_loss_fallback(tmp_path):
    path = write_factory(
        tmp_path, "mlp_factory",
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Linear(8, 2)\n",
    )  # fmt: skip
    for source in (f"{path}:build", torch.nn.Linear(8, 2)):
        spec = resolve_model(source)
        assert (spec.task, spec.input_kind, spec.loss) == ("custom", "custom", "sum")
        assert len(spec.notes) == 1 and "sum of its first output" in spec.notes[0]
        with pytest.raises(BadInputError, match="make_batch"):
            make_batch_for(spec, torch.nn.Linear(8, 2), Workload(), torch.float32)
    with pytest.raises(BadInputError, match="--task"):
        resolve_model(torch.nn.Linear(8, 2), task="causal-lm")


def test_factory_running_argparse_at_import_reads_no_memfit_option(tmp_path, monkeypatch):
    path = write_factory(
        tmp_path, "script_factory",
        "import argparse\n"
        "import torch\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--lr', type=float, default=1e-3)\n"
        "args = parser.parse_args()  # no __main__ guard\n"
        "def build():\n"
        "    return torch.nn.Linear(8, 2)\n",
    )  # fmt: skip
    argv = ["memfit", "estimate", f"{path}:build", "--seq", "128"]
    monkeypatch.setattr(sys, "argv", argv)
    spec = resolve_model(f"{path}:build")
    assert spec.task == "custom"
    assert sys.argv == argv


def test_factory_exiting_at_import_says_to_guard_it(tmp_path):
    path = write_factory(
        tmp_path, "exiting_factory",
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--data', required=True)\n"
        "args = parser.parse_args()\n"
        "def build():\n"
        "    pass\n",
    )  # fmt: skip
    with pytest.raises(BadInputError) as info:
        resolve_model(f"{path}:build")
    msg = str(info.value)
    assert "SystemExit" in msg and 'if __name__ == "__main__":' in msg and str(path) in msg


def test_factory_imports_a_module_beside_it(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "memfit_test_sibling_net.py").write_text(
        "import torch\nWIDTH = 16\ndef net():\n    return torch.nn.Linear(WIDTH, 2)\n"
    )
    (folder / "memfit_test_lazy_sibling.py").write_text("HEIGHT = 4\n")
    path = write_factory(
        folder, "sibling_factory",
        "from memfit_test_sibling_net import net\n"
        "def build():\n"
        "    import memfit_test_lazy_sibling  # imported when build runs\n"
        "    return net()\n"
        "def make_batch(batch_size):\n"
        "    import torch, memfit_test_lazy_sibling\n"
        "    return torch.randn(batch_size, 16)\n",
    )  # fmt: skip
    before = list(sys.path)
    try:
        spec = resolve_model(f"{path}:build")
        model = spec.build(None, "sdpa")
        assert n_params(model) == 16 * 2 + 2
        assert spec.user_batch(3, None, None).shape == (3, 16)
        assert sys.path == before
    finally:
        for name in ("memfit_test_sibling_net", "memfit_test_lazy_sibling"):
            sys.modules.pop(name, None)


# ----------------------------------------------------------------------------- make_batch


def spec_with(make_batch) -> ModelSpec:
    spec = resolve_model(torch.nn.Linear(8, 2))
    spec.make_batch = make_batch
    return spec


def test_seq_len_reaches_a_make_batch_that_takes_it():
    spec = spec_with(lambda batch_size, seq_len: torch.zeros(batch_size, seq_len, 8))
    assert spec.batch_is_user_defined and spec.batch_takes_seq_len
    batch = make_batch_for(spec, torch.nn.Linear(8, 2), Workload(batch_size=2, seq_len=128),
                           torch.float32)  # fmt: skip
    assert batch.shape == (2, 128, 8)
    # Required and not given: an error that says to give it.
    with pytest.raises(BadInputError, match="--seq"):
        make_batch_for(spec, torch.nn.Linear(8, 2), Workload(batch_size=2), torch.float32)
    # With a default, not given: the make_batch's own default.
    spec = spec_with(lambda batch_size, seq_len=16: torch.zeros(batch_size, seq_len, 8))
    batch = make_batch_for(spec, torch.nn.Linear(8, 2), Workload(batch_size=2), torch.float32)
    assert batch.shape == (2, 16, 8)


def test_seq_len_a_make_batch_cannot_take_is_refused():
    spec = spec_with(lambda batch_size: torch.zeros(batch_size, 256, 8))
    assert spec.batch_is_user_defined and not spec.batch_takes_seq_len
    w = Workload(batch_size=2, seq_len=128)
    with pytest.raises(BadInputError) as info:
        make_batch_for(spec, torch.nn.Linear(8, 2), w, torch.float32)
    msg = str(info.value)
    assert "--seq 128" in msg and "def make_batch(batch_size, seq_len)" in msg
    # Without --seq the batch is the make_batch's, as it always was.
    batch = make_batch_for(spec, torch.nn.Linear(8, 2), w.with_(seq_len=None), torch.float32)
    assert batch.shape == (2, 256, 8)


def test_sizes_left_to_transformers_defaults_are_named(tmp_path):
    # Issue 29: {"model_type": "llama"} was estimated as a 6.74 B model without a word.
    from memfit.models.sources import resolve_model

    only_type = tmp_path / "config.json"
    only_type.write_text('{"model_type": "llama"}')
    (note,) = [n for n in resolve_model(str(only_type)).notes if "does not give" in n]
    assert note.startswith(
        "the file does not give vocab_size=32000, hidden_size=4096, num_hidden_layers=32, "
        "num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008, "
        "max_position_embeddings=2048: these come from transformers' LlamaConfig defaults"
    )
    # GPT-2's own names (n_embd, n_layer, ...) count as given.
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(
        '{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 100, '
        '"n_positions": 32}'
    )
    assert not [n for n in resolve_model(str(gpt2)).notes if "does not give" in n]
