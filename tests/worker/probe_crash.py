"""A box probe child that dies as a crashing CUDA library would."""

import os
import sys

if __name__ == "__main__":
    print("Segmentation fault in libcuda", file=sys.stderr, flush=True)
    os.abort()
