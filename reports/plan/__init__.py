"""Plan a run before renting GPUs: memory fit, step time and MFU of a traced rank on a named GPU."""
