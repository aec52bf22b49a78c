"""The studio's terminal UI: Textual screens over the same LoadManager the REST API serves."""
