"""Heuristics that find good plans fast: warmstart.py seeds the exact search."""
