"""The processes the tool starts and watches: supervision, liveness, trust, CPU contention, process titles, CUDA's checkpoint calls."""
