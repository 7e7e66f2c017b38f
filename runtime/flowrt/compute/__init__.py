"""flowrt.compute: the compute flow of a serving node (DESIGN §7).

It owns, today, chained page hashing (`hashing`): the keys of KV pages, equal exactly when the
prefixes up to them are, in every process and on every machine; its C fast path
(`_pagehash`, compiled by setup.py from `_pagehash.pyx` and the headers beside it: BLAKE2b in
`_blake2b.h`, the chain in `_pagehash.h` and `_pagechain.h`) and which of the two runs
(`native`); multimodal prefix matching (`prefix`, with its segments, histories and frames in
`prefix_*`, docs/prefix.md) and the encoders' LRU cache (`encoder_cache`); the engine adapter,
the paged reference engine, continuous batching and the paged generation driver (`engine`,
docs/engines.md).

It may import flowrt.params (the Global Params Pool), flowrt.memory and flowrt's base modules
(errors, values, tables, ...); never control, transport, registry, gateway or deploy.
"""
