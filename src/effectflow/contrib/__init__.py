"""Integrations with other systems, one subpackage each; the core package never imports them."""
