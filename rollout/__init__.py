"""Inference engines, workflows and reward functions."""
