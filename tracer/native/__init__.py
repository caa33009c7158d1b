"""The compiled hook: its C++ sources, their build (`python -m tracer.native.build_ext`) into
tracer/native/_collector.so, and the loader that says which path records an op."""
