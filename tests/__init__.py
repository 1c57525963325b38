"""The test suite. unit/: no Ray, engine, sandbox, pi CLI or subprocess job (pure logic, config,
loss math, docs and layering checks). e2e/: tests that start Ray, the engine, the sandbox, pi,
a two-node cluster or the policy server, or run jobs and the CLI end to end. fixtures/: the
helpers both import (tests.fixtures.X); conftest.py here is shared by both."""
