"""What the tests share: oracles (llama.cpp, the reference forward), tiny checkpoints and GGUF
files built on the fly, the fake backend, the text corpus, and strict mode (`require`)."""
