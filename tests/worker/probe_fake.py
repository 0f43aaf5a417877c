"""A box probe child that reports the figures of a card it does not have (as a GPU box's would)."""

import json
import sys

if __name__ == "__main__":
    figures = {
        "gpu_name": "NVIDIA GeForce RTX 4090",
        "matmul_tflops": 150.0,
        "h2d_pinned_gbps": 24.0,
        "d2h_pinned_gbps": 25.0,
        "cuda_context_bytes": 500 * 2**20,
        "host_memory_available_bytes": 2**36,
        "nvme_free_bytes": 2**40,
        "nvme_dir": sys.argv[-1] if len(sys.argv) > 1 else ".",
    }
    print("a line of noise before the result")
    print(json.dumps({"figures": figures, "errors": {"cpu_adam_elements_per_s": "not built here"}}))
