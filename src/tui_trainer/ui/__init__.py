"""The ui layer: the Textual dashboard. Imports core, never torch."""
