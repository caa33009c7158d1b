"""Output for people and tools: text formatting, the `optrace` command, plots, Perfetto exports."""
