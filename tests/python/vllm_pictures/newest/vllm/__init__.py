"""A picture of vLLM main at 00f4240 for kvstrand's tests (see ../../README.md)."""
__version__ = "0.29.0.dev0+g00f4240"
