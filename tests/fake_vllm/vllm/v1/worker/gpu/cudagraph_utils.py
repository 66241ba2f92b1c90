"""vLLM's V2 model runner's CUDA graphs, as far as the probe reads them (0.34.0's
``vllm/v1/worker/gpu/cudagraph_utils.py``): a step replays a FULL graph through ``run_fullgraph``,
runs PIECEWISE graphs through ``run_pw_graph``, or calls the model itself (eager)."""


class CudaGraphManager:
    def __init__(self, capture_sizes):
        self.capture_sizes = list(capture_sizes)

    def run_fullgraph(self, desc):
        return desc

    def run_pw_graph(self, model, model_inputs):
        return model_inputs


class ModelCudaGraphManager(CudaGraphManager):
    def run_fullgraph(self, desc):  # vLLM's subclass returns the hidden states through super()
        return super().run_fullgraph(desc)
