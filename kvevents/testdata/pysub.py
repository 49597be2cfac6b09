# A subscriber written with pyzmq (libzmq) and msgpack, as a router in
# Python would be: it subscribes, takes batches 0 to N-1 live, asks the
# replay socket (a DEALER: an empty frame, then the number) for what it
# missed, and prints each batch decoded, as canonical JSON, one line a
# sequence number. PUB and REPLAY are ZMQ endpoints (tcp:// or ipc://).
# Run by TestPythonSubscriber, which skips without it.
import json, sys
import msgpack, zmq

pub, replay, topic, n = sys.argv[1], sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.connect(pub)
sub.setsockopt(zmq.SUBSCRIBE, topic)
dealer = ctx.socket(zmq.DEALER)
dealer.connect(replay)
print("subscribed", flush=True)
got = {}
def take(seq, payload):
    if 0 <= seq < n and seq not in got:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        assert isinstance(batch, list) and len(batch) == 3, batch
        assert isinstance(batch[0], float), batch[0]
        batch[0] = "%.6f" % batch[0]  # a float's text differs between Python and Go
        got[seq] = json.dumps(batch, sort_keys=True, separators=(",", ":"))
nxt = 0
while nxt < n:
    t, seqb, payload = sub.recv_multipart()
    assert t == topic
    seq = int.from_bytes(seqb, "big")
    if seq > nxt:
        dealer.send_multipart([b"", nxt.to_bytes(8, "big")])
        while True:
            empty, rs, rp = dealer.recv_multipart()
            rs = int.from_bytes(rs, "big", signed=True)
            if rs == -1:
                break
            take(rs, rp)
    take(seq, payload)
    while nxt in got:
        nxt += 1
for s in range(n):
    print(s, got[s], flush=True)
print("done", flush=True)
