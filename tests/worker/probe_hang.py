"""A box probe child that never finishes (a wedged driver call), with a child of its own; both pids
go to the file named by PROBE_HANG_PIDS."""

import os
import subprocess
import sys
import time

if __name__ == "__main__":
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.environ["PROBE_HANG_PIDS"], "w") as f:
        f.write(f"{os.getpid()} {grandchild.pid}")
    time.sleep(120)
