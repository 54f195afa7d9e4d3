"""effectflow."""
