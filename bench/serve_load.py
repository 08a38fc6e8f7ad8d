#!/usr/bin/env python3
"""Load test of `hone serve` on loopback: CLIENTS concurrent clients each send single-text
/predict requests, one after another, for SECONDS seconds. Prints requests/s (= sequences/s),
p50/p90/p99 latency, and the statuses, as one JSON line; standard library only.

Usage: bench/serve_load.py PORT [--clients 64] [--seconds 10] [--words 100]
Each text has about WORDS words (random words of the model's vocabulary are not needed:
the text is repeated words of a fixed sentence, truncated by the server at its length).
"""
import argparse
import http.client
import json
import threading
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--words", type=int, default=100)
    a = p.parse_args()
    sentence = "the film was good and the plot was fine but the acting was bad ."
    words = (sentence.split() * (a.words // 14 + 1))[: a.words]
    body = json.dumps({"inputs": " ".join(words), "truncate": True})
    latencies, statuses, lock = [], {}, threading.Lock()
    deadline = time.monotonic() + a.seconds

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
            mine.append(time.monotonic() - t0)
            seen[status] = seen.get(status, 0) + 1
        with lock:
            latencies.extend(mine)
            for k, v in seen.items():
                statuses[k] = statuses.get(k, 0) + v

    start = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    latencies.sort()
    q = lambda f: 1000 * latencies[min(len(latencies) - 1, int(f * len(latencies)))] if latencies else None
    ok = statuses.get(200, 0)
    print(json.dumps({"clients": a.clients, "seconds": round(elapsed, 2), "words": a.words, "requests": len(latencies),
                      "ok_per_second": round(ok / elapsed, 1), "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99),
                      "p99_over_p50": round(q(0.99) / q(0.5), 2) if latencies else None,
                      "statuses": {str(k): v for k, v in statuses.items()}}))


if __name__ == "__main__":
    main()
