"""A run's config and its knobs, presets, what this machine can run, and the dataset files a run uses."""
