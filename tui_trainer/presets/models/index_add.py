"""A locally connected net whose forward pools with `index_add_`, as graph and point-cloud
nets pool (scatter sums over neighbourhoods), written for 28x28 grey images (the MNIST
family). Each of 8 maps weighs every pixel, then `index_add_` sums the weighted pixels of
each 4x4 patch into one of 7x7 cells; two linear layers classify the 8 x 49 sums.

On CUDA, `index_add_` adds with atomics: the 16 additions into each cell land in whatever
order the threads reach them, and float addition is not associative, so two runs of one
config can part in the last bits of the first step's forward. With deterministic
algorithms on (deterministic = warn or on) CUDA takes a sorted, deterministic path for it.
On a CPU it adds in index order: two runs agree bit for bit.

    tui-trainer repro --config experiments/gpu-parting-index-add.toml
"""

import torch
from torch import nn

SIDE, PATCH, MAPS = 28, 4, 8
CELLS = (SIDE // PATCH) ** 2


class IndexAddNet(nn.Module):
    def __init__(self):
        super().__init__()
        rows = torch.arange(SIDE).repeat_interleave(SIDE) // PATCH
        cols = torch.arange(SIDE).repeat(SIDE) // PATCH
        self.register_buffer("cell", rows * (SIDE // PATCH) + cols)    # pixel -> its cell
        self.weight = nn.Parameter(torch.randn(MAPS, SIDE * SIDE) / PATCH)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(MAPS * CELLS, 128), nn.ReLU(),
                                  nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weighted = x.flatten(1).unsqueeze(1) * self.weight              # (B, MAPS, 784)
        pooled = weighted.new_zeros(x.shape[0], MAPS, CELLS)
        pooled.index_add_(2, self.cell, weighted)                       # the atomic adds
        return self.head(torch.relu(pooled))
