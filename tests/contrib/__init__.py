"""Tests of the integrations in effectflow.contrib."""
