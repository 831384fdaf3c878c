"""Speed against the strongest rivals: `attn bench`.

rivals.py   attn's model in PyTorch (eager and torch.compile) and JAX (jit),
            in attn's algorithm and reassociated
calls.py    how many numpy calls (and function calls) attn's step makes: counts, not times
timing.py   the training step of attn and of every rival, side by side, per thread count
sweeps.py   a training process's peak memory; sweep efficiency and scaling; the headline's wall time
suite.py    all of it as one result, its Markdown table and its files (the CLI's entry)
devices.py  the fast path's devices, each with its plain alternative, switched off from the bench's side
device_gains.py  what each device saves, side by side with it off: `attn bench --devices`
"""
