"""A completion's `timings`, in llama-server's names and arithmetic.

The first generated token comes from the prompt's last logits, so it costs no decode step: the
generation rate counts the steps after it (one token: 0.0), as llama-server does.
"""

from __future__ import annotations


def timings(prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float) -> dict:
    steps = max(predicted_n - 1, 0)
    return {
        "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n > 0 else 0.0,
        "prompt_per_second": prompt_n / (prompt_ms / 1000) if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps and predicted_ms > 0 else 0.0,
        "predicted_per_second": steps / (predicted_ms / 1000) if steps and predicted_ms > 0 else 0.0,
    }
