"""credal_dro: bulk-calibrated credal (linear-vacuous) ambiguity sets for DRO under contamination
(Chen, Berrett, Damoulas, Caprio, ICML 2026)."""
