"""Real sizes: builds of the Llama 1B / 3B / 8B shapes against onnxruntime-genai's builder
(scale), and a ~1 GB artifact through a registry (registry)."""
