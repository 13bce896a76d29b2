"""Model-Optimizer: one model, several precisions, one OpenAI-compatible endpoint."""

__version__ = "0.1.0"
