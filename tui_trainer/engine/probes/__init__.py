"""What a copy of a run shows on demand, trained or replayed in a process of its own: where its memory goes, where its step time goes, where two runs part and why, what its net sees in a digit."""
