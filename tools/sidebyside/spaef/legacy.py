"""The denoiser as it was before issue 31, rebuilt on top of the current paperflow.spaef.model for the
diagnosis (diagnose.py), so that each of the three differences from the released code can be switched
back on its own:
- `init`: torch's default init of FeatAE's linear layers (kaiming-uniform weights, uniform biases) and of
  the gate, where the released code uses Xavier-normal / Xavier-uniform weights and zero biases;
- `latent`: ELU and dropout applied to the latent (the released code leaves it linear);
- `att`: torch's xavier_uniform on the (1, heads, out) attention vectors, whose fans differ from PyG's glorot.
`legacy_model(...)` is a context manager that patches paperflow.spaef.model while it is open."""

from __future__ import annotations

import contextlib

from torch import nn
from torch.nn import functional as F

import paperflow.spaef.model as M


@contextlib.contextmanager
def legacy_model(init: bool = True, latent: bool = True, att: bool = True):
    base_feat, base_spaef_init = M.FeatAE, M.SpaEF.__init__

    class LegacyFeatAE(base_feat):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for layer in (*self.enc, *self.dec):
                if init and isinstance(layer, nn.Linear):
                    layer.reset_parameters()
                if att and isinstance(layer, M.GATConv):
                    nn.init.xavier_uniform_(layer.att_src)
                    nn.init.xavier_uniform_(layer.att_dst)

        def forward(self, x, edge_index):
            if not latent:
                return super().forward(x, edge_index)
            edge_index = M.as_adjacency(edge_index, x.shape[0])
            layers = [*self.enc, *self.dec]
            for i, layer in enumerate(layers):
                x = layer(x, edge_index) if isinstance(layer, M.GATConv) else layer(x)
                if i < len(layers) - 1:
                    x = F.dropout(F.elu(x), self.dropout, self.training)
            return F.relu(x)

    def spaef_init(self, *args, **kwargs):
        base_spaef_init(self, *args, **kwargs)
        if init and self.gate is not None:
            self.gate.reset_parameters()

    M.FeatAE, M.SpaEF.__init__ = LegacyFeatAE, spaef_init
    try:
        yield
    finally:
        M.FeatAE, M.SpaEF.__init__ = base_feat, base_spaef_init
