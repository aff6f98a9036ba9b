"""Backends: device-specific speed-ups beside the core (outside its line budget, tests/test_size.py).

    cpu.py   fast fp32 paths on CPU: oneDNN matmuls, fused SwiGLU MLP, grouped-query SDPA,
             weight gradients added into .grad in place, malloc reuse
"""
