import os
import sys

# Tests run tiny tensors: one thread avoids OpenMP barrier spinning on a shared 2-core machine.
# Set before torch loads, for this process and the servers it starts (EngineConfig.cpu_threads's
# default is $OMP_NUM_THREADS, else the machine's physical cores).
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402

# Triton runs on CPU only in its interpreter, and only if this is set before `import triton`.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(__file__))
