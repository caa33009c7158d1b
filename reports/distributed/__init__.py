"""Distributed traces: ranks side by side, collectives and their traffic."""
