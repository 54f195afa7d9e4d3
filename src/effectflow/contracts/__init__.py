"""Side-effect contracts (tools), step contracts (workflows), and where they are registered."""
