"""The `megatron-auto` command line: plan, estimate, show.

The only place in the package that prints; the library logs.
"""
