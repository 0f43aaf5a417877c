"""Jobs: submit, list, show, cancel, reprioritise; their events (JSON and SSE), metrics, checkpoints."""
