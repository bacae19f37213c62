import os

cuda = None if os.environ.get("FAKE_TORCH_NO_CUDA") == "1" else "13.0"
