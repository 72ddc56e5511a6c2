"""Bidirectional LSTM as two one-directional LSTMs (deprecated in torch_npu)."""
import warnings

import torch

__all__ = []


class BiLSTM(torch.nn.Module):
    """Input (seq_len, batch, input_size) -> (seq_len, batch, 2 * hidden_size): the forward LSTM's
    outputs next to the backward LSTM's (run on the time-reversed input, re-reversed)."""

    def __init__(self, input_size, hidden_size):
        super().__init__()
        warnings.warn("torch_npu.contrib.BiLSTM is deprecated. Please check document for replacement.",
                      FutureWarning)
        self.fw_rnn = torch.nn.LSTM(input_size, hidden_size, bidirectional=False)
        self.bw_rnn = torch.nn.LSTM(input_size, hidden_size, bidirectional=False)

    def forward(self, inputs):
        forward_out, _ = self.fw_rnn(inputs)
        backward_out, _ = self.bw_rnn(torch.flip(inputs, [0]))
        return torch.cat((forward_out, torch.flip(backward_out, [0])), 2)
