"""Environments: real libraries' tasks, the sandbox, pi's tools, and the execution reward.

The reward's threat model (what a submission can and cannot reach) is written where it is
enforced: envs/reward.py (which files are taken), envs/screen.py (what a body may use, by
resolved name), envs/verify_plugin/rlvr_verify.py (the reporter/runner split that keeps the
tests' outcome out of the tested code's reach), envs/gate.py (the differential gate: the
candidate against the original in processes of their own) and envs/sandbox.py (the process
boundary).
"""
