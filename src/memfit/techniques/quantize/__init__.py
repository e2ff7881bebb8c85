"""Quantized base weights: the config and handler, library layouts, reading and tracing."""
