"""The engine layer: the training process. Imports torch, never textual."""
