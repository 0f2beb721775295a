"""Model registry, loading (HF id, local dir, GGUF + conversion cache) and the layer-wise runner."""
