import importlib
import os
import types

from vllm.logprobs import FlatLogprobs
from vllm.logprobs import Logprob as Lp


class SamplingParams:
    def __init__(self, max_tokens=16, temperature=1.0, logprobs=None, seed=None, ignore_eos=False,
                 flat_logprobs=False, detokenize=True):
        self.max_tokens, self.temperature, self.logprobs = max_tokens, temperature, logprobs
        self.flat_logprobs, self.detokenize = flat_logprobs, detokenize


class Tokenizer:
    """What the engine asks of a tokenizer when the model is no real folder: decode."""

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"t{i}" for i in ids)


class LLM:
    """Counts what the harness asks of it; generates request i of a call as [10 + i] * max_tokens."""

    def __init__(self, model, **kwargs):
        from cascade_repro.vllm_surface import probe
        from vllm.engine.arg_utils import EngineArgs  # noqa: F401 - vLLM loads its general plugins here

        probe.register()
        self.model, self.kwargs = model, kwargs
        self.fa = importlib.import_module("vllm.v1.attention.backends.flash_attn")
        self.worker = importlib.import_module("vllm.v1.worker.worker_base").WorkerWrapperBase()
        self.layers = [self.fa.FlashAttentionImpl() for _ in range(2)]
        self.resets = 0
        self.generated = []
        self.rpcs = 0
        mc = types.SimpleNamespace(dtype="torch.bfloat16", disable_cascade_attn=kwargs.get("disable_cascade_attn"),
                                   enforce_eager=kwargs.get("enforce_eager", False),
                                   max_model_len=kwargs.get("max_model_len", 8192), seed=kwargs.get("seed"))
        cfg = types.SimpleNamespace(
            model_config=mc,
            parallel_config=types.SimpleNamespace(tensor_parallel_size=kwargs.get("tensor_parallel_size")),
            cache_config=types.SimpleNamespace(enable_prefix_caching=kwargs.get("enable_prefix_caching"),
                                               block_size=16, gpu_memory_utilization=0.5),
            attention_config=types.SimpleNamespace(**(kwargs.get("attention_config") or {})),
            use_v2_model_runner=False,
        )
        self.llm_engine = types.SimpleNamespace(vllm_config=cfg,
                                                engine_core=types.SimpleNamespace(shutdown=lambda: None))

    def get_tokenizer(self):
        if getattr(self, "_tok", None) is None:
            if os.path.isdir(self.model):  # a real model folder: the worker renders prompts with it
                from transformers import AutoTokenizer

                self._tok = AutoTokenizer.from_pretrained(self.model)
            else:
                self._tok = Tokenizer()
        return self._tok

    def reset_prefix_cache(self):
        self.resets += 1
        return True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.rpcs += 1
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def generate(self, prompts, params, use_tqdm=True):
        import torch

        self.generated.append(len(prompts))
        n = len(prompts)
        builder = self.fa.FlashAttentionMetadataBuilder()
        for _ in range(params.max_tokens):  # one decision per step, as the model runner takes it
            use = builder.use_cascade_attention(common_prefix_len=512, query_lens=[1] * n, num_query_heads=9,
                                                num_kv_heads=3, use_alibi=False, use_sliding_window=False,
                                                use_local_attention=False, num_sms=132, dcp_world_size=1)
            if use:
                for layer in self.layers:  # a cascade step: the merge gets this suffix LSE
                    layer.forward(None, (None, None, None, torch.arange(6.0).view(2, 3)), 512)
        outs = []
        for i in range(n):
            toks = [10 + i] * params.max_tokens
            lps = None
            # detokenize=False: no text, and no string for a logprob token (vLLM's tokenizer is None then)
            word = (lambda t: f"t{t}") if params.detokenize else (lambda t: None)
            if params.logprobs and params.flat_logprobs:  # sampled token first, then the top-k by rank
                lps = FlatLogprobs()
                for t in toks:
                    lps.append_fast([t, t, 99, 98], [-0.5, -0.5, -1.5, -2.5], [1, 1, 2, 3], [word(x) for x in (t, t, 99, 98)])
            elif params.logprobs:
                lps = [{t: Lp(-0.5, 1, word(t)), 99: Lp(-1.5, 2, word(99)), 98: Lp(-2.5, 3, word(98))} for t in toks]
            # vLLM's text is the tokens decoded, as the engine decodes them when vLLM does not
            text = self.get_tokenizer().decode(toks, skip_special_tokens=True) if params.detokenize else ""
            c = types.SimpleNamespace(token_ids=toks, text=text, finish_reason="length", logprobs=lps)
            outs.append(types.SimpleNamespace(outputs=[c]))
        return outs
