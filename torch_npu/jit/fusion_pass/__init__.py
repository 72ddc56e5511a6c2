"""TorchScript fusion passes, one per fused op."""
