"""Judge: pure metrics, the pairs and their noise controls, the statistics and the verdicts."""
