"""schedir: a scheduler IR for LLM serving engines."""
