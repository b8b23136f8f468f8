"""megatron-auto: automatic hybrid parallelism for Megatron-Core training.

spec -> profile -> cost -> search -> Plan -> runtime. Everything outside
`megatron_auto.runtime` imports only the standard library and numpy.
"""
__version__ = "0.1.0"
