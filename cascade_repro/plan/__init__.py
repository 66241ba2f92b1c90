"""Plan: the matrix spec, its cells and engine keys, the model, shards, the time estimate."""
