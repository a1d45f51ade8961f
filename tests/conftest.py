import os

# Triton runs on CPU only in its interpreter, and only if this is set before `import triton`.
if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
