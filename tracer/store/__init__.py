"""The trace directory: which directories optrace may write into, the directory held by descriptor, and the
part files the rows are written to."""
