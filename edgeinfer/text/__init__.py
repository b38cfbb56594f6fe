"""Text in and out of token ids, below the engine: the tokenizer and chat templates."""
