"""Test helpers that ship with effectflow: simulated providers and fault plans."""
