"""Streaming generation from a Python app."""
import sys

import edgeinfer

eng = edgeinfer.load("default", n_ctx=1024)
prompt = " ".join(sys.argv[1:]) or "The three most useful kitchen tools are"
for piece in eng.stream(prompt, max_tokens=64, temperature=0.7, seed=42):
    print(piece, end="", flush=True)
print()
