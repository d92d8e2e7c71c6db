"""LLM inference time-and-energy benchmark (ML.ENERGY-style) on Hugging Face transformers generation."""
