"""A GPU box's identity for the box probe's tests (a card this machine does not have)."""

FAKE_BOX = {
    "gpus": [{"uuid": "GPU-0000-fake", "name": "NVIDIA GeForce RTX 4090"}],
    "driver": "580.1",
    "torch": "2.11.0",
    "deepspeed": "0.19.8",
    "probe_version": 1,
}
