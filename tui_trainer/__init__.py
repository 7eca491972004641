"""tui-trainer: controlled PyTorch training experiments, from one terminal."""

__version__ = "0.2.0"
