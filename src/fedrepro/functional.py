"""A model as a function of one flat parameter vector: what the server-side optimisers (FedLAW's weights,
proxy training) and the Hessian logging differentiate through."""

from __future__ import annotations

import torch
from torch.func import functional_call

from fedrepro.evaluation import eval_mode
from fedrepro.flat import learnt_buffers


class FunctionalModel:
    """The module's output with its parameters taken from a flat vector w (differentiable in w).

    Training on the proxy set (``__call__``) runs in the module's train mode, as the engine keeps it
    (the code's central model is in train mode during its server optimisation; with BatchNorm running
    statistics the passes update the module's global statistics in place); scoring teachers (``logits``)
    runs in eval mode, dropout off and BatchNorm on its running statistics, as the engine evaluates."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.layout = [(name, p.shape, p.numel()) for name, p in module.named_parameters()]
        # the learnt buffers in FlatModel.buffers' order, so a client's own statistics can be handed in
        named = dict(module.named_buffers())
        self.buffer_layout = [(name, named[name].shape, named[name].numel()) for name in learnt_buffers(module)]

    def slices(self):
        """(name, slice of the flat vector) per parameter tensor, in the flat order."""
        offset = 0
        for name, _, n in self.layout:
            yield name, slice(offset, offset + n)
            offset += n

    def __call__(self, w: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        params = {name: w[s].view(shape) for (name, s), (_, shape, _) in zip(self.slices(), self.layout)}
        return functional_call(self.module, params, (inputs,))

    def _buffers(self, flat: torch.Tensor) -> dict:
        out, offset = {}, 0
        for name, shape, n in self.buffer_layout:
            out[name] = flat[offset : offset + n].view(shape)
            offset += n
        return out

    @torch.no_grad()
    def logits(
        self,
        w: torch.Tensor,
        inputs: torch.Tensor,
        batch_size: int,
        buffers: torch.Tensor | None = None,
        batch_statistics: bool = False,
    ) -> torch.Tensor:
        """Outputs on all inputs, in fixed chunks of batch_size (teachers' logits, computed once a round).
        ``buffers``: BatchNorm running statistics to score with (a client's own) instead of the module's.
        ``batch_statistics``: score in train mode, each chunk normalised by its own statistics (FedLAW's
        code scores FedBE's freshly built teachers so); copies of the buffers take the running updates."""
        params = {name: w[s].view(shape) for (name, s), (_, shape, _) in zip(self.slices(), self.layout)}
        if batch_statistics:
            # copies take the train-mode updates (running statistics, batch counters): the module's stay
            params.update({name: b.clone() for name, b in self.module.named_buffers()})
            was = self.module.training
            self.module.train()
            try:
                return torch.cat(
                    [
                        functional_call(self.module, params, (inputs[start : start + batch_size],))
                        for start in range(0, len(inputs), batch_size)
                    ]
                )
            finally:
                self.module.train(was)
        if buffers is not None:
            params.update(self._buffers(buffers))
        with eval_mode(self.module):
            return torch.cat(
                [
                    functional_call(self.module, params, (inputs[start : start + batch_size],))
                    for start in range(0, len(inputs), batch_size)
                ]
            )
