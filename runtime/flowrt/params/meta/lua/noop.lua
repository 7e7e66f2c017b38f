-- the cheapest script: the floor a one-round-trip script is measured against (bench/kv_meta.py)
return 1
