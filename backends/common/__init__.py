"""Pieces shared by the PyTorch-native strategies (FSDP1, FSDP2)."""
