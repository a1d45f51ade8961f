import os
import sys

import torch

# Triton runs on CPU only in its interpreter, and only if this is set before `import triton`.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)  # one thread: the root conftest.py says why
sys.path.insert(0, os.path.dirname(__file__))
