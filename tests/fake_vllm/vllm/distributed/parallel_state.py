def destroy_model_parallel():
    pass


def destroy_distributed_environment():
    pass
