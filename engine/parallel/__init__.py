"""Tensor parallelism: the sharding plan, the collectives, the sharded model and its KV pool."""
