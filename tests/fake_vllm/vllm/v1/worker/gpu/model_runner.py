"""vLLM's V2 model runner (the only one in 0.34.0), as far as the probe's facts RPC reads it: its
class and ``get_model``."""


class GPUModelRunner:
    def __init__(self, model):
        self.model = model

    def get_model(self):
        return self.model
