"""Reading checkpoints as they ship: folders, safetensors headers, tensor data, and source formats (bf16, fp8-block,
int4 compressed-tensors) decoded exactly to BF16 for quantization."""
