"""The parts of scripts/tls-check.py: the stack it runs, its probes, the rotation under load."""
