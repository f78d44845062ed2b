"""Workflows turn tasks into scored experiences using an engine and reward functions."""
