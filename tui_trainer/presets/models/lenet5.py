"""LeNet-5 (LeCun et al., 1998), as a user would bring it: two convolutions with pooling and
three linear layers, written for 28x28 digits (the first convolution pads by 2, as the
paper's 32x32 input had room for). Logits out: tui-trainer's loss takes them as they come.

    tui-trainer run --set model=experiments/models/lenet5.py:LeNet5
"""

import torch
from torch import nn


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.Tanh(), nn.AvgPool2d(2),
            nn.Conv2d(6, 16, 5), nn.Tanh(), nn.AvgPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.Tanh(),
            nn.Linear(120, 84), nn.Tanh(), nn.Linear(84, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
