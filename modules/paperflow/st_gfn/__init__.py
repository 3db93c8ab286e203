"""ST-GFN (Spectral Time-Dependent GFlowNets, ICML 2026), reconstructed: see workflows/st_gfn/README.md."""
