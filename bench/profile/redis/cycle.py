#!/usr/bin/env python3
"""Redis lock cycle over a raw socket (RESP), one connection per process:
SET key owner NX PX 30000, then EVALSHA of the check-and-delete script on the same key.
usage: cycle.py CLIENTS SECONDS -> total cycles/s (sum over processes)."""
import os, random, socket, sys, time
from multiprocessing import Process, Queue
SCRIPT = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
          "return redis.call('del', KEYS[1]) else return 0 end")
OWNER = b'6f1c2e0a-3b7d-4c55-9a1e-2f8b7d0c4e91'
def cmd(*args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)
def reply(s, buf):
    # read one complete reply (simple/integer/bulk/error); good enough for these commands
    while True:
        i = buf.find(b'\r\n')
        if i >= 0:
            t = buf[:1]
            if t == b'$':
                n = int(buf[1:i])
                end = i + 2 + (n + 2 if n >= 0 else 0)
                if len(buf) >= end:
                    return buf[:end], buf[end:]
            else:
                return buf[:i + 2], buf[i + 2:]
        buf += s.recv(65536)
def worker(cid, secs, q):
    s = socket.create_connection(('127.0.0.1', 6379))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b''
    s.sendall(cmd('SCRIPT', 'LOAD', SCRIPT)); r, buf = reply(s, buf)
    sha = r.split(b'\r\n')[1]
    rnd = random.Random(cid); n = 0
    end = time.perf_counter() + 1 + secs; start = None
    while True:
        now = time.perf_counter()
        if start is None and now >= end - secs:
            start, n = now, 0
        if now >= end:
            break
        key = b'prof:%d:%d' % (cid, rnd.randrange(1, 10**9))
        s.sendall(cmd('SET', key, OWNER, 'NX', 'PX', 30000)); r, buf = reply(s, buf)
        assert r == b'+OK\r\n', r
        s.sendall(cmd('EVALSHA', sha, 1, key, OWNER)); r, buf = reply(s, buf)
        assert r == b':1\r\n', r
        n += 1
    q.put(n / (time.perf_counter() - start))
if __name__ == '__main__':
    c, secs = int(sys.argv[1]), float(sys.argv[2])
    q = Queue(); ps = [Process(target=worker, args=(i, secs, q)) for i in range(c)]
    [p.start() for p in ps]; [p.join() for p in ps]
    print('%.1f' % sum(q.get() for _ in ps))
