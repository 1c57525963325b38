"""Rollout sources: the Rollouts protocol and its agentic and length implementations."""
