"""The core layer: config, session store, paths. Imports neither torch nor textual."""
