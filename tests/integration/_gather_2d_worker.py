"""Run under `accelerate launch` by test_accelerate.py: gathers of 2-D tensors, as eval loops do."""
import json
import sys

import torch
from accelerate import Accelerator

accelerator = Accelerator()
rank = accelerator.process_index
outcome = {}
try:
    logits = torch.full((2, 3), float(rank), device=accelerator.device)
    outcome["gathered"] = accelerator.gather(logits).cpu().tolist()
except RuntimeError as error:
    outcome["error"] = str(error).splitlines()[0]
if accelerator.is_main_process:
    with open(sys.argv[1], "w") as f:
        json.dump(outcome, f)
accelerator.wait_for_everyone()
