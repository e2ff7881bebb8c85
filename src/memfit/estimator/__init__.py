"""The estimate: trace a step on fake CPU tensors (the tracker, the step runner, CUDA's
emulation and attention choice in `trace/`; generation in `generation/`), replay repeated blocks,
and turn the stream into device memory.

Other packages import what they use from here, never from a submodule (tests/test_layout.py);
names load on first use, so `import memfit.estimator` stays light.

May import: `memfit.techniques`, `memfit.models`, `memfit.cuda` and the top level.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memfit.estimator.auto_precision import (
        resolve_precision,
    )
    from memfit.estimator.compose import (
        composable,
        composed_trace_spec,
        composition_matches,
    )
    from memfit.estimator.estimation import (
        Estimate,
        estimate,
        estimate_from_trace,
        trace_spec,
    )
    from memfit.estimator.generation.kv_cache import (
        CacheWatcher,
    )
    from memfit.estimator.host_memory import (
        machine_ram_bytes,
    )
    from memfit.estimator.parallel import (
        run_all,
        workers,
    )
    from memfit.estimator.predict import (
        MicroBatchLine,
    )
    from memfit.estimator.trace import cache as trace_cache
    from memfit.estimator.trace.attention import (
        attention_class,
    )
    from memfit.estimator.trace.cache import (
        check_environment,
        dumps_compact,
        key_of,
        lookup,
        pack_trace,
        session,
        set_enabled,
        store,
        unpack_trace,
    )
    from memfit.estimator.trace.collector import (
        without_full_collections,
    )
    from memfit.estimator.trace.cublas_operands import (
        operand_copies,
    )
    from memfit.estimator.trace.cuda_emulation import (
        CudaEmulation,
    )
    from memfit.estimator.trace.resident import (
        got_gradient,
        resident_floor_bytes,
    )
    from memfit.estimator.trace.step_runner import (
        Trace,
        traced_micro_batches,
    )
    from memfit.estimator.trace.tracker import (
        META_KEY,
        SCALAR_CONSTANT_OPS,
        Tracker,
        memory_tensor,
        parameter_modules,
        tag_graph,
    )
    from memfit.estimator.trace.value_reads import (
        UNIFORM_OPS,
    )

#: Exported name -> the module that defines it (a module itself for `trace_cache`).
_WHERE = {
    "attention_class": "memfit.estimator.trace.attention",
    "CacheWatcher": "memfit.estimator.generation.kv_cache",
    "check_environment": "memfit.estimator.trace.cache",
    "composable": "memfit.estimator.compose",
    "composed_trace_spec": "memfit.estimator.compose",
    "composition_matches": "memfit.estimator.compose",
    "CudaEmulation": "memfit.estimator.trace.cuda_emulation",
    "dumps_compact": "memfit.estimator.trace.cache",
    "Estimate": "memfit.estimator.estimation",
    "estimate": "memfit.estimator.estimation",
    "estimate_from_trace": "memfit.estimator.estimation",
    "got_gradient": "memfit.estimator.trace.resident",
    "key_of": "memfit.estimator.trace.cache",
    "lookup": "memfit.estimator.trace.cache",
    "machine_ram_bytes": "memfit.estimator.host_memory",
    "memory_tensor": "memfit.estimator.trace.tracker",
    "META_KEY": "memfit.estimator.trace.tracker",
    "MicroBatchLine": "memfit.estimator.predict",
    "operand_copies": "memfit.estimator.trace.cublas_operands",
    "pack_trace": "memfit.estimator.trace.cache",
    "parameter_modules": "memfit.estimator.trace.tracker",
    "resident_floor_bytes": "memfit.estimator.trace.resident",
    "resolve_precision": "memfit.estimator.auto_precision",
    "run_all": "memfit.estimator.parallel",
    "SCALAR_CONSTANT_OPS": "memfit.estimator.trace.tracker",
    "session": "memfit.estimator.trace.cache",
    "set_enabled": "memfit.estimator.trace.cache",
    "store": "memfit.estimator.trace.cache",
    "tag_graph": "memfit.estimator.trace.tracker",
    "Trace": "memfit.estimator.trace.step_runner",
    "trace_cache": "memfit.estimator.trace.cache",
    "trace_spec": "memfit.estimator.estimation",
    "traced_micro_batches": "memfit.estimator.trace.step_runner",
    "Tracker": "memfit.estimator.trace.tracker",
    "UNIFORM_OPS": "memfit.estimator.trace.value_reads",
    "unpack_trace": "memfit.estimator.trace.cache",
    "without_full_collections": "memfit.estimator.trace.collector",
    "workers": "memfit.estimator.parallel",
}

__all__ = [
    "META_KEY",
    "SCALAR_CONSTANT_OPS",
    "UNIFORM_OPS",
    "CacheWatcher",
    "CudaEmulation",
    "Estimate",
    "MicroBatchLine",
    "Trace",
    "Tracker",
    "attention_class",
    "check_environment",
    "composable",
    "composed_trace_spec",
    "composition_matches",
    "dumps_compact",
    "estimate",
    "estimate_from_trace",
    "got_gradient",
    "key_of",
    "lookup",
    "machine_ram_bytes",
    "memory_tensor",
    "operand_copies",
    "pack_trace",
    "parameter_modules",
    "resident_floor_bytes",
    "resolve_precision",
    "run_all",
    "session",
    "set_enabled",
    "store",
    "tag_graph",
    "trace_cache",
    "trace_spec",
    "traced_micro_batches",
    "unpack_trace",
    "without_full_collections",
    "workers",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'memfit.estimator' has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if name == "trace_cache" else getattr(module, name)
    globals()[name] = value
    return value
