#!/usr/bin/env python3
"""Load test of `hone serve` on loopback: CLIENTS concurrent clients each send single-text
/predict requests, one after another, for SECONDS seconds, spread over PROCESSES processes
(Python's threads share one core). Prints requests/s (= sequences/s), p50/p90/p99 latency
and the statuses, as one JSON line; standard library only.

Usage: bench/serve_load.py PORT [--clients 64] [--processes 1] [--seconds 10] [--words 100]
Each text has about WORDS words (random words of the model's vocabulary are not needed:
the text is repeated words of a fixed sentence, truncated by the server at its length).
p50_late_ms and p99_late_ms count only the requests sent after the first second: a tail
that the early requests alone make (the server meeting batch shapes for the first time)
shows as the difference.
"""
import argparse
import http.client
import json
import multiprocessing
import threading
import time


def run_clients(a, body, deadline, clients, out):
    latencies, statuses, lock = [], {}, threading.Lock()

    def client():
        conn = http.client.HTTPConnection(a.host, a.port, timeout=60)
        mine, seen = [], {}
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            try:
                conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                status = r.status
            except (OSError, http.client.HTTPException):
                status = "error"
                conn.close()
                conn = http.client.HTTPConnection(a.host, a.port, timeout=60)
            mine.append((t0, time.monotonic() - t0))
            seen[status] = seen.get(status, 0) + 1
        with lock:
            latencies.extend(mine)
            for k, v in seen.items():
                statuses[k] = statuses.get(k, 0) + v

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put((latencies, statuses))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--words", type=int, default=100)
    a = p.parse_args()
    sentence = "the film was good and the plot was fine but the acting was bad ."
    words = (sentence.split() * (a.words // 14 + 1))[: a.words]
    body = json.dumps({"inputs": " ".join(words), "truncate": True})
    start = time.monotonic()
    deadline = start + a.seconds
    out = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=run_clients,
                                     args=(a, body, deadline, a.clients // a.processes + (i < a.clients % a.processes),
                                           out))
             for i in range(a.processes)]
    for q in procs:
        q.start()
    latencies, statuses = [], {}
    for _ in procs:
        lat, st = out.get()
        latencies.extend(lat)
        for k, v in st.items():
            statuses[k] = statuses.get(k, 0) + v
    for q in procs:
        q.join()
    elapsed = time.monotonic() - start
    late = sorted(lat for t0, lat in latencies if t0 >= start + 1.0)
    latencies = sorted(lat for _, lat in latencies)

    def quantile(xs, f):
        return 1000 * xs[min(len(xs) - 1, int(f * len(xs)))] if xs else None

    q = lambda f: quantile(latencies, f)
    ok = statuses.get(200, 0)
    print(json.dumps({"clients": a.clients, "processes": a.processes, "seconds": round(elapsed, 2), "words": a.words,
                      "requests": len(latencies), "ok_per_second": round(ok / elapsed, 1), "p50_ms": q(0.5),
                      "p90_ms": q(0.9), "p99_ms": q(0.99),
                      "p99_over_p50": round(q(0.99) / q(0.5), 2) if latencies else None,
                      "p50_late_ms": quantile(late, 0.5), "p99_late_ms": quantile(late, 0.99),
                      "statuses": {str(k): v for k, v in statuses.items()}}))


if __name__ == "__main__":
    main()
