import dataclasses


@dataclasses.dataclass
class EngineArgs:
    model: str = ""
    attention_config: dict | None = None
    compilation_config: dict | None = None
    disable_cascade_attn: bool = True
