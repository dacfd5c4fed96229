"""FFT convolution: transform sizes, the work count, and the spectral executors."""
