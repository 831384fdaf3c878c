"""The model: forward/backward pairs, the score modes, the head and its associations, the fast model,
the textbook model it is held to, the mechanism's per-row statistics and finite differences.
Imports nothing of attn above it."""
