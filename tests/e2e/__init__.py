"""Tests that start Ray, the engine, the sandbox, pi, a cluster or the policy server, or run jobs end to end."""
