__version__ = "0.26.0-fake"


def __getattr__(name):  # lazy, as vLLM's own package: `del vllm.LLM` brings the attribute back
    if name in ("LLM", "SamplingParams"):
        from vllm.entrypoints import llm

        return getattr(llm, name)
    raise AttributeError(name)
