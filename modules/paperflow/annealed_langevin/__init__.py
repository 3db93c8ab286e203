"""annealed_langevin: time-inhomogeneous Langevin samplers (ULA, diffusion, tempering, dilation, DAZ)
on Gaussian-mixture targets, their histogram KL/TV metrics, and the inpainting experiment."""
