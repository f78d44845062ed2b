"""rlcore's wire schema: generated protobuf and gRPC code (see proto/generate.py)."""
