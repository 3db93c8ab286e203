"""DecFus: decentralised layer-wise fusion with dynamic exploration and exploitation (ICML 2026)."""
