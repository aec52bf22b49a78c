"""What the engine and the studio agree on, importable by both and importing neither.

The studio talks to the engine only by argv, environment and HTTP; the constants and rules those
carry live here once: the KV page size, the environment variables and how a switch among them is
read, and how a bearer key is compared.
"""

PAGE_SIZE = 256  # KV cells per page; contexts are whole pages
