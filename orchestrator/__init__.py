"""The loop above the actors: training driver, rollouts, evaluation, weight sync, checkpoints, logs."""
