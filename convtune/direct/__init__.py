"""Direct (spatial-domain) convolution code paths: the float64 reference and im2col + GEMM."""
