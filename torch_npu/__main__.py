"""``python -m torch_npu``: the ``torch-npu`` command-line tool."""
import sys

from torch_npu.cli import main

sys.exit(main())
