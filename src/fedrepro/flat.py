"""One flat parameter vector per model: client updates, norms and aggregation are vector ops."""

from __future__ import annotations

import torch
from torch import nn


def learnt_buffers(module: nn.Module) -> list[str]:
    """Names of the buffers that hold state a client learns: persistent floating-point ones.

    A non-persistent buffer is left out of ``state_dict``, so it cannot carry trained state across a
    save and load; PyTorch and transformers use them for constants rebuilt from the config (GPT-NeoX's
    rotary ``inv_freq``). Integer buffers are counters or masks, not averaged quantities (BatchNorm's
    ``num_batches_tracked`` only matters with ``momentum=None``, which no model here uses). Every client
    gets the same copy of both, so the flat engine leaves them in the module; persistent float buffers
    (BatchNorm's running mean and variance) go into ``FlatModel.buffers``."""
    names = []
    for prefix, sub in module.named_modules():
        for name, buf in sub.named_buffers(recurse=False):
            if buf.is_floating_point() and name not in sub._non_persistent_buffers_set:
                names.append(f"{prefix}.{name}" if prefix else name)
    return names


class FlatModel:
    """Rebinds a module's parameters (and their gradients) as views into two flat buffers, and its
    learnt buffers (BatchNorm running statistics) as views into a third.

    ``flat`` is the model; ``grad`` receives backward's gradients in place; ``buffers`` holds the
    running statistics, which BatchNorm updates in place in train mode and reads in eval mode (empty for
    models without them). One object serves every client: loading a client's start point is one copy
    into ``flat`` (and one into ``buffers``).
    """

    def __init__(self, module: nn.Module, device: torch.device):
        self.module = module.to(device)
        params = list(self.module.parameters())
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.empty(self.numel, device=device)
        self.grad = torch.zeros(self.numel, device=device)
        offset = 0
        for p in params:
            n = p.numel()
            self.flat[offset : offset + n].copy_(p.data.reshape(-1))
            p.data = self.flat[offset : offset + n].view_as(p)
            p.grad = self.grad[offset : offset + n].view_as(p)
            offset += n
        self._params = params
        self.buffers = self._bind_buffers(device)

    def _bind_buffers(self, device: torch.device) -> torch.Tensor:
        owners = dict(self.module.named_modules())
        slots = []
        for name in learnt_buffers(self.module):
            owner, _, leaf = name.rpartition(".")
            slots.append((owners[owner], leaf))
        dtypes = {sub._buffers[leaf].dtype for sub, leaf in slots}
        if len(dtypes) > 1 or (dtypes and dtypes != {self.flat.dtype}):
            raise ValueError(
                f"{type(self.module).__name__}'s learnt buffers have dtypes {sorted(map(str, dtypes))}; "
                f"the flat engine holds them in one {self.flat.dtype} vector"
            )
        buffers = torch.empty(sum(sub._buffers[leaf].numel() for sub, leaf in slots), device=device)
        offset = 0
        for sub, leaf in slots:
            b = sub._buffers[leaf]
            n = b.numel()
            buffers[offset : offset + n].copy_(b.reshape(-1))
            sub._buffers[leaf] = buffers[offset : offset + n].view_as(b)
            offset += n
        return buffers

    def loss_and_grad(self, loss_fn, x, y) -> torch.Tensor:
        """Forward and backward on one batch; gradients land in ``self.grad``."""
        self.grad.zero_()
        loss = loss_fn(self.module(x), y)
        loss.backward()
        return loss.detach()

    def check_bound(self) -> None:
        """Backward accumulates into the views; this guards against a library replacing them."""
        offset = 0
        for p in self._params:
            if p.grad is None or p.grad.data_ptr() != self.grad[offset:].data_ptr():
                raise RuntimeError("a parameter's gradient is no longer a view into the flat buffer")
            offset += p.numel()
