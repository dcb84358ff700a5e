"""One line on the CUDA device the GPU scripts will use (gpu_check.sh, gpu_speed.sh), or exit non-zero with one
line saying why there is none."""

import os
import sys

try:
    import torch
except ImportError:
    sys.exit("torch is not installed for this interpreter (set PYTHON=...)")
if not torch.cuda.is_available():
    sys.exit(
        f"torch {torch.__version__} sees no CUDA device (torch.version.cuda={torch.version.cuda}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
    )
p = torch.cuda.get_device_properties(0)
print(
    f"{torch.cuda.device_count()} device(s); using 0: {p.name}, {p.total_memory / 2**30:.0f} GiB, "
    f"capability {p.major}.{p.minor}; torch {torch.__version__}, CUDA {torch.version.cuda}"
)
