def destroy_model_parallel():
    pass


def destroy_distributed_environment():
    pass


TP_WORLD_SIZE = 1  # the fake LLM sets it from tensor_parallel_size


def get_tensor_model_parallel_world_size():
    return TP_WORLD_SIZE
