"""PH-VAE: phase-type variational autoencoders for heavy-tailed data (Ziani, Horvath, Ballarini, ICML 2026)."""
