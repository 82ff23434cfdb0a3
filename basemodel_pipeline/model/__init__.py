"""Model code: the residual MLP trunk, task heads, LoRA adapters (merged into the weights before saving), and
safetensors checkpoints."""
