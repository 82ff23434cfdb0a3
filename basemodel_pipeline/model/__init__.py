"""Model code: the residual MLP trunk, task heads, and safetensors checkpoints."""
