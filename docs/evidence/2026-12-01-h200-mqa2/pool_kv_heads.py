"""The embedded model reduced to one KV head: a real-weights MQA model, for an end-to-end check.

SmolLM2-135M has 9 query heads over 3 KV heads (GQA, head_dim 64). In the kernel grid, FA2's
cascade path in vLLM 0.26 was wrong for MQA decode batches of 32+ requests (one KV head) and right
for GQA; dummy weights could not show it end to end (their attention output is ~0: every logprob
came out bitwise equal). No MQA checkpoint is at hand offline, so this makes one from the embedded
model: MODE ``mean`` averages the K and V projections over the KV heads (the GQA paper's way to
start MQA from a multi-head checkpoint), MODE ``0``/``1``/``2`` keeps that KV head for every query
head. Neither is a good language model without retraining (on CPU, greedy: ``mean`` writes
"-----..." and ``0`` writes varied nonsense), but ``0`` has non-degenerate logits, so the harness's
cascade-vs-flat judgement against a noise control still means something. RoPE is applied per head
after the projection, so both reductions are well defined.

    python pool_kv_heads.py MODE OUT_DIR     # config.json, model.safetensors, the tokenizer
"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cascade_repro.models import embedded_model_dir


def main(mode: str, out: Path) -> None:
    src = embedded_model_dir()
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.bfloat16)
    cfg = model.config
    kv, d = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    for layer in model.model.layers:
        attn = layer.self_attn
        for name in ("k_proj", "v_proj"):
            lin = getattr(attn, name)
            heads = lin.weight.data.view(kv, d, -1).float()
            w = heads.mean(0) if mode == "mean" else heads[int(mode)]
            new = torch.nn.Linear(w.shape[1], d, bias=False, dtype=lin.weight.dtype)
            new.weight.data.copy_(w.to(lin.weight.dtype))
            setattr(attn, name, new)
        attn.num_key_value_groups = cfg.num_attention_heads
    cfg.num_key_value_heads = 1
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    print(f"{out}: {cfg.num_attention_heads} query heads, 1 KV head ({mode} of {kv}), head_dim {d}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
