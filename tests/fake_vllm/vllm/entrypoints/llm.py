import importlib
import os
import types

from vllm.logprobs import FlatLogprobs
from vllm.logprobs import Logprob as Lp


class SamplingParams:
    def __init__(self, max_tokens=16, temperature=1.0, logprobs=None, seed=None, ignore_eos=False,
                 flat_logprobs=False, detokenize=True, repetition_penalty=1.0, frequency_penalty=0.0,
                 presence_penalty=0.0):
        self.max_tokens, self.temperature, self.logprobs = max_tokens, temperature, logprobs
        self.flat_logprobs, self.detokenize = flat_logprobs, detokenize
        self.penalties = (repetition_penalty, frequency_penalty, presence_penalty)


class Tokenizer:
    """What the engine asks of a tokenizer when the model is no real folder: decode."""

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"t{i}" for i in ids)


DEFAULT_BUDGET = 8192  # vLLM's max_num_batched_tokens for the LLM class


class _Layer:
    """An attention layer: its implementation, the KV cache dtype it was built with and its bound
    cache (an FP8 cache in 1-byte elements, as vLLM stores it)."""

    def __init__(self, impl, kv_cache_dtype="auto"):
        import torch

        self.impl = impl
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_cache = torch.zeros(4, dtype=torch.uint8 if kv_cache_dtype.startswith("fp8") else torch.bfloat16)


class _Model:
    """The model a worker runs, as the probe's facts RPC walks it: modules with an ``impl``."""

    def __init__(self, impls, kv_cache_dtype="auto"):
        self.layers = [_Layer(i, kv_cache_dtype) for i in impls]

    def modules(self):
        return [self, *self.layers]


def _impl_class(backend):
    """The implementation class a backend's layers are built with (FLASH_ATTN: the fake's own)."""
    if backend in (None, "FLASH_ATTN"):
        return None
    # vLLM's own names: FlashInferImpl, TritonAttentionImpl, ...
    known = {"FLASHINFER": "FlashInfer", "TRITON_ATTN": "TritonAttention"}
    name = known.get(backend) or "".join(w.capitalize() for w in str(backend).lower().split("_"))
    return type(name + "Impl", (), {"forward": lambda self, *a, **k: None})


class LLM:
    """Counts what the harness asks of it; generates request i of a call as [10 + i] * max_tokens.

    ``FAKE_VLLM_IGNORE=a,b`` makes it drop those engine arguments, as a vLLM that does not honour a
    setting would: a twin's proof of effect must then come out 0.
    """

    def __init__(self, model, **kwargs):
        from cascade_repro.vllm_surface import probe
        from vllm.engine.arg_utils import EngineArgs  # noqa: F401 - vLLM loads its general plugins here

        probe.register()
        self.model, self.kwargs = model, kwargs
        ignore = {x.strip() for x in os.environ.get("FAKE_VLLM_IGNORE", "").split(",") if x.strip()}
        kwargs = {k: v for k, v in kwargs.items() if k not in ignore}
        importlib.import_module("vllm.distributed.parallel_state").TP_WORLD_SIZE = kwargs.get("tensor_parallel_size") or 1
        self.budget = kwargs.get("max_num_batched_tokens") or DEFAULT_BUDGET
        # A fixed KV cache (num_gpu_blocks_override blocks of 16 tokens): decode steps preempt past it.
        blocks = kwargs.get("num_gpu_blocks_override")
        self.kv_tokens = None if blocks is None else int(blocks) * 16
        self.params_seen = []
        self.prefix_caching = bool(kwargs.get("enable_prefix_caching"))
        self.sched_mod = importlib.import_module("vllm.v1.core.sched.scheduler")
        # async_scheduling=True installs the AsyncScheduler subclass (SchedulerConfig.get_scheduler_cls)
        self.sched_cls = (importlib.import_module("vllm.v1.core.sched.async_scheduler").AsyncScheduler
                          if kwargs.get("async_scheduling") else self.sched_mod.Scheduler)
        # The V2 runner's graphs (0.34.0): none when eager; a step of more tokens than the largest
        # captured size runs eager.
        self.capture_sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
        graphs = importlib.import_module("vllm.v1.worker.gpu.cudagraph_utils")
        self.graphs = None if kwargs.get("enforce_eager") else graphs.ModelCudaGraphManager(self.capture_sizes)
        self.fa = importlib.import_module("vllm.v1.attention.backends.flash_attn")
        self.worker = importlib.import_module("vllm.v1.worker.worker_base").WorkerWrapperBase()
        self.layers = [self.fa.FlashAttentionImpl() for _ in range(2)]
        other = _impl_class((kwargs.get("attention_config") or {}).get("backend"))
        impls = self.layers if other is None else [other() for _ in range(2)]
        runner = importlib.import_module("vllm.v1.worker.gpu.model_runner").GPUModelRunner(
            _Model(impls, str(kwargs.get("kv_cache_dtype") or "auto")))
        self.worker.worker = types.SimpleNamespace(model_runner=runner)
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
                                               block_size=16, gpu_memory_utilization=0.5,
                                               cache_dtype=kwargs.get("kv_cache_dtype", "auto")),
            scheduler_config=types.SimpleNamespace(async_scheduling=kwargs.get("async_scheduling", False),
                                                   max_num_batched_tokens=self.budget,
                                                   max_num_seqs=kwargs.get("max_num_seqs", 256)),
            compilation_config=types.SimpleNamespace(
                cudagraph_mode="NONE" if kwargs.get("enforce_eager") else "FULL_AND_PIECEWISE",
                cudagraph_capture_sizes=self.capture_sizes),
            attention_config=types.SimpleNamespace(**(kwargs.get("attention_config") or {})),
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

    def _step(self, sched):
        """One engine step: the scheduler's, then the model runner's, through a graph if one fits."""
        out = sched.schedule()
        tokens = sum(out.num_scheduled_tokens.values())
        if self.graphs is not None and tokens <= max(self.capture_sizes):
            if all(n == 1 for n in out.num_scheduled_tokens.values()):
                self.graphs.run_fullgraph(tokens)  # a uniform decode batch: the FULL graph
            else:
                self.graphs.run_pw_graph(None, {})

    def _prefill(self, prompts):
        """The scheduler's prefill steps of a call: the budget handed out prompt by prompt."""
        sched = self.sched_cls(self.budget, self.kv_tokens)
        for i, p in enumerate(prompts):
            sched.add(f"r{i}", len(p.get("prompt_token_ids", ())) if isinstance(p, dict) else 1)
        while sched.pending():
            self._step(sched)
        return sched

    def generate(self, prompts, params, use_tqdm=True):
        import torch

        self.generated.append(len(prompts))
        self.params_seen.append(params)
        n = len(prompts)
        sched = self._prefill(prompts)
        builder = self.fa.FlashAttentionMetadataBuilder()
        for _ in range(params.max_tokens):  # one decision per step, as the model runner takes it
            self._step(sched)
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
            # The warm-up put the shared prefix in the cache: every request of a wave finds it there.
            cached = 16 * (min(300, len(prompts[i].get("prompt_token_ids", ()))) // 16) if self.prefix_caching and isinstance(prompts[i], dict) else 0
            outs.append(types.SimpleNamespace(outputs=[c], num_cached_tokens=cached))
        return outs
