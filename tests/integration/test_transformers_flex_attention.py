"""transformers' flex-attention path on npu, under compile: its block masks
(``masking_utils``: causal, sliding window, packed sequences, with and without
padding) equal the CPU's, and a tiny llama with ``attn_implementation=
"flex_attention"`` matches the CPU (SDPA) forward and backward.

The compiled flex attention itself is tested in ``tests/test_compile_flex_attention.py``,
whose shapes and helpers this file shares; it lives here because it needs transformers
(``make test-integration`` installs it).
"""
import sys
from pathlib import Path

import torch
import transformers
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_compile_flex_attention import (  # noqa: E402,F401  (_fresh_dynamo: the autouse fixture)
    B, DOCS, LENGTHS, S, WINDOW, _fresh_dynamo, assert_same_block_mask, pytestmark)


def transformers_mask_functions(masking_utils, device):
    """transformers' causal, sliding-window and packed-sequence (document) masks."""
    docs = torch.tensor(DOCS, device=device)
    return [masking_utils.causal_mask_function,
            masking_utils.sliding_window_causal_mask_function(WINDOW),
            masking_utils.and_masks(masking_utils.causal_mask_function,
                                    masking_utils.packed_sequence_mask_function(docs))]


def test_transformers_flex_block_masks_match_cpu():
    from transformers import masking_utils
    # Bool, as create_causal_mask hands it on after its preprocessing.
    attention_mask = torch.ones(B, S, dtype=torch.bool)
    attention_mask[1, LENGTHS[1]:] = False
    functions = {d: transformers_mask_functions(masking_utils, d) for d in ("npu", "cpu")}
    for i in range(len(functions["cpu"])):
        for padding in (None, attention_mask):
            masks = {d: masking_utils.flex_attention_mask(
                B, S, S, mask_function=functions[d][i], device=d,
                attention_mask=None if padding is None else padding.to(d)) for d in ("npu", "cpu")}
            assert_same_block_mask(masks["npu"], masks["cpu"])


def test_transformers_llama_flex_attention_forward_backward_matches_cpu():
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ids = torch.randint(0, 64, (B, 9), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 6:] = 0
    results = {}
    # CPU cannot run flex attention with grads: its reference is SDPA.
    for device, impl in (("npu", "flex_attention"), ("cpu", "sdpa")):
        config._attn_implementation = impl
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).to(device)
        out = model(ids.to(device), attention_mask=attention_mask.to(device))
        # Padded query rows attend to nothing real in either backend: compare
        # (and backpropagate from) the valid positions only.
        valid = attention_mask.to(device).bool()
        out.logits[valid].sum().backward()
        results[device] = (out.logits[valid].detach().cpu(),
                           {n: p.grad.cpu() for n, p in model.named_parameters()})
        if device == "npu":
            compiled_graphs = counters["stats"]["unique_graphs"]
    # The npu run went through compiled flex attention (its mask and attention).
    assert compiled_graphs >= 2
    torch.testing.assert_close(results["npu"][0], results["cpu"][0])
    for name, grad in results["cpu"][1].items():
        torch.testing.assert_close(results["npu"][1][name], grad, msg=name)
