"""Per technique of issue 13: llama-2-7b, batch 1 x 2048, rtx-4090 (23.64 GiB), bf16-true
unless the row says otherwise: device total, verdict, the two largest categories at the peak and
the host memory, as a Markdown table (about 30 s on 2 cores).

    python benchmarks/techniques_7b.py
"""

import time

import memfit
from memfit import Workload
from memfit.errors import MemfitError
from memfit.units import format_bytes
from memfit.workload import LoraConfig

base = dict(seq_len=2048, precision="bf16-true")
rows = [
    ("AdamW (plain)", {}),
    ("optimizer step in backward", dict(optimizer_in_backward=True)),
    ("paged-adamw-8bit", dict(optimizer="paged-adamw-8bit")),
    (
        "paged-adamw-8bit + step in backward",
        dict(optimizer="paged-adamw-8bit", optimizer_in_backward=True),
    ),
    (
        "checkpointing + activation offload (torchtune)",
        dict(checkpointing="blocks", offload_activations="torchtune"),
    ),
    ("chunked loss (8)", dict(chunked_loss=8)),
    (
        "checkpointing + FSDP2 CPU offload, 64 GiB host",
        dict(checkpointing="blocks", fsdp_cpu_offload=True, host_memory="64GiB"),
    ),
    ("QLoRA nf4 r=16", dict(quantize="nf4", lora=LoraConfig(rank=16))),
    (
        "QLoRA nf4 r=16 + checkpointing",
        dict(quantize="nf4", lora=LoraConfig(rank=16), checkpointing="blocks"),
    ),
    (
        "QLoRA nf4-dq r=16 + checkpointing + prepare_kbit",
        dict(
            quantize="nf4-dq", lora=LoraConfig(rank=16), checkpointing="blocks", prepare_kbit=True
        ),
    ),
    ("inference, int8 (LLM.int8)", dict(mode="inference", quantize="int8")),
    ("inference, int4-wo (torchao)", dict(mode="inference", quantize="int4-wo")),
    ("inference, fp8 (torchao)", dict(mode="inference", quantize="fp8")),
]
print("| technique | device total | fits | dominant at the peak | host |")
print("|---|---|---|---|---|")
for name, kw in rows:
    t = time.time()
    try:
        e = memfit.estimate("llama-2-7b", Workload(**{**base, **kw}), gpu="rtx-4090")
    except MemfitError as ex:
        print(f"| {name} | error: {ex} |")
        continue
    b = e.profile.breakdown
    top = sorted(((v, k) for k, v in b.items() if v), reverse=True)[:2]
    dom = ", ".join(f"{k} {format_bytes(v)}" for v, k in top)
    host = format_bytes(e.host.peak_bytes) if e.host and e.host.worth_reporting else "-"
    total = format_bytes(e.profile.device_total_bytes)
    verdict = "yes" if e.fits else "no"
    seconds = time.time() - t
    print(f"| {name} | {total} | {verdict} | {dom} | {host} |  ({seconds:.0f} s)", flush=True)
