"""Recurrent ops: npu_lstm / npu_lstm_cell (+ backward), the multi-layer _lstm_npu / _gru_npu entry points and npu_gru."""
