"""Megatron-core trainer backend: fp8rl FP8 linears inside Megatron parallel layers."""
