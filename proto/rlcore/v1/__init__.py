"""rlcore.v1: generated from the .proto files next to this module (`python proto/generate.py`)."""
