"""Where a forward step runs: the CPU (our native kernels) or CUDA."""
