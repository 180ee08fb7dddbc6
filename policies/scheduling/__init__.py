"""Scheduling policies, one module each; the module name is the policy's name."""
