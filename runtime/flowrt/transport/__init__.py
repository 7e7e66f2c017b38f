"""flowrt.transport: how a deployment's processes talk (ZMQ sockets, message structs, codecs).

It owns the wire: `messages` (typed, versioned message structs, decoded and validated at the
edge), `codec` (frame payloads: pickle protocol 5 with out-of-band buffers, sent as separate
ZMQ frames so large buffers are not copied into the message), `sockets` (private ipc
directories, endpoint helpers) and `keys` (a deployment's keys, and the handshake every
socket between its processes authenticates with). It imports nothing of flowrt but `values`;
the control core never imports it.
"""
