"""The model side: kernels, memory layouts, checkpoint layouts, SFT and the default model.

Between the pure core (`rl`) and the processes that hold a model (`actors`): everything here
imports torch or transformers, and nothing here knows about Ray, sandboxes or episodes."""
