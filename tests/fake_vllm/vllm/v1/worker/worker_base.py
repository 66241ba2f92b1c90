class WorkerWrapperBase:
    def __init__(self):
        self.rpc_rank = 0
