"""The engine's HTTP server: llama-server's native endpoints and OpenAI's, over one scheduler."""
