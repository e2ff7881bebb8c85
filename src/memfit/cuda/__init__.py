"""The CUDA side: the caching-allocator simulator and its PYTORCH_CUDA_ALLOC_CONF, the GPU
catalog, the device memory beyond tensors (context, workspaces), and `--gpu` resolution.

May import: the top level only.
"""
