"""The commands of a run that spans processes and machines: `join` (this machine's ranks of
a run started on node 0) and `worker` (one rank, started by torchrun's agent, never by
hand)."""
