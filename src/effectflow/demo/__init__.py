"""The demos `effectflow demo` runs."""
