"""Clients of the world outside: the Kubernetes API, slurmrestd, and what keeps them honest.

Below activities/, worker/ and webhook/, above bridge/: they do I/O and know no Temporal workflow.
"""
