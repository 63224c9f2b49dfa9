"""A picture of vLLM v0.18 for kvstrand's tests (see ../../README.md)."""
__version__ = "0.18.2"
