"""Tests that need no Ray, engine, sandbox, pi CLI or subprocess job."""
